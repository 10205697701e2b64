// Depthwise convolution (groups = C, channel multiplier m) over x (N, C, H, W) with weight (C * m, 1, kH, kW):
// output channel co = c * m + k reads input channel c.  Forward, input gradient, weight and bias gradients.
//
// Everything here is memory-bound on a GPU (a 3x3 output costs 9 FMAs per 8 bytes of fp32 traffic), so the
// kernels are built around reading each tensor from DRAM once and keeping every lane busy:
//
// * Tiled kernels: a block takes one "unit" at a time = one output tile (tile_h x tile_w) of one output plane
//   for `per_block` consecutive images.  The input tile plus its halo, for those images, is staged in shared
//   memory (16-byte loads where the rows are aligned, element loads otherwise) and converted to the
//   accumulation type once.  Each thread owns one item: a column strip of V vertically consecutive outputs of
//   one image, so neighbouring lanes read neighbouring shared-memory words (no bank conflicts at stride 1) and
//   write neighbouring outputs (coalesced).  Small planes (14x14, 7x7, 4x4) take the whole plane as the tile and
//   pack many planes per block, so a block still has ~256 busy threads: in the persistent forward and stride-1
//   input gradient, consecutive channels of one image (contiguous in memory: staged and written as one run each,
//   the outputs through shared memory, staged flat; their own instantiations, template PACK = true); elsewhere
//   images of one channel (uniform weights, broadcast loads).  From 5x5 on, those small-plane instantiations (and
//   the weight gradient's SPREAD) order thread items planes before strips and pad the staged planes so that a
//   quarter warp's 16-byte shared loads hit every bank once (AlignedStaging); the packed ones stage their weights.
//   So do the per-image SPREAD instantiations of tiles whose row of items spans less than a bank row (28 wide).
// * Specialised kernels (template K = 3, 5, 7 and S = 1, 2, dilation 1: depthwise_fwd<T, I, K, S>,
//   depthwise_bwd_input<T, I, K> at stride 1, depthwise_bwd_weight<T, I, K, S>) keep the K x K weights (or tap
//   sums) in registers and slide a register window down an item of V x 4 outputs: each staged row segment is read
//   once, with 16-byte shared loads, and feeds up to 4 * ceil(K / S) outputs (the per-image weight gradient at S = 2
//   stages its rows de-interleaved, even columns then odd, so that those loads are on consecutive chunks:
//   AlignedStaging's SPLIT, load_split_row; the per-image forward at S = 2 stages nothing, its rows read from global
//   memory into registers, direct_fma).  No division in their loops over units (the forward and the
//   input gradient are one persistent kernel, depthwise_persistent; its comment says how), rows staged in 16-byte
//   chunks, outputs written (grad_out read) with one vector access per row.
// * Generic kernels (K = 0: any kernel size, stride, dilation) keep the weights in shared memory, run only the
//   taps that read inside the plane (tap_range) and, when stride == dilation along H, slide a register window down
//   each kernel column.  Large kernels at stride 1, dilation 1 (31x31) whose planes fit whole take
//   depthwise_fwd_large / depthwise_bwd_input_large instead: items of 2 x 8 outputs, lanes over images, a staged
//   kernel row's broadcast weights against 8-column chunks of src, 64 FMAs per pair of 16-byte loads.  Tiny
//   planes (depthwise_fwd_planes, depthwise_bwd_input_planes): one thread per plane, a block's consecutive planes
//   staged and written back as contiguous runs; their <T, I, K> instantiations (and depthwise_bwd_weight_planes)
//   unroll a K x K window at stride 1 over zero-padded planes.
// * The input gradient at stride 1 is the same tiled convolution over grad_output with the kernel flipped (a
//   gather: no atomics); at other strides one thread per input pixel gathers exactly the outputs that read it
//   from a staged grad_output tile (depthwise_bwd_input_strided, the fold_col2im scheme of unfold.cu with the
//   window range solved once per thread; depthwise_bwd_input_phased<T, I, K, S> for K x K at stride S, its taps
//   fixed by the pixel's phase and unrolled; both persistent), or from global memory (depthwise_bwd_input_gather)
//   when no tile fits.
// * Weight and bias gradients are two-stage and deterministic.  Stage 1 (depthwise_bwd_weight[_generic],
//   depthwise_bwd_bias) maps threads over (image, pixel) items of one output channel, accumulates per tap in
//   registers over a fixed range of units, reduces over the block in a fixed shuffle/warp order and writes one
//   partial row per block (depthwise_bwd_weight_large, for kernels with more taps than a block has lanes,
//   maps the threads over taps instead; depthwise_bwd_weight_lanes, for the windows of depthwise_fwd_large, runs
//   its correlation with grad_out's plane as the kernel, a lane per image, and adds the lanes by shuffles;
//   depthwise_bwd_weight_generic's tiny-plane units, a lane over each of 32 consecutive channels of a few
//   images).  The last block of a channel to arrive then sums its partial rows in a fixed order, in the same
//   launch (finish_rows; a channel of one row writes the gradient directly).  No float atomics anywhere, so every
//   run gives the same bits, whatever the scheduling.
// * *_direct kernels (no shared memory) cover windows that do not overlap and tiles that would not fit.
//
// Launch contract of the tiled kernels (cupyconv/ops/depthwise.py plans it): blockDim.x is a multiple of 32 and
// covers every item of a unit (depthwise_bwd_weight_large: every (tap run, slice)); tile_h is a multiple of V
// (depthwise_bwd_input_strided: of STRIDED_ROWS times the stride, and tile_w of the stride; _phased: both of
// S * PHASED_CELLS; the specialised
// kernels: tile_w a multiple of FWD_COLUMNS, shared rows pitched to 16 bytes); dynamic shared
// memory holds the staged tiles plus weights or reduction scratch.  Every kernel loops over its units, so any grid size is correct.
#include "common.cuh"
#include "async_copy.cuh"

// Constants shared with the planner: cupyconv/ops/depthwise.py defines them (KERNELS.defines) and every
// compiler of this file gets them as -D options, so they exist once.
//   FWD_COLUMNS       output columns per thread item of the specialised kernels (one vector access per row);
//   STRIP_ROWS_3/5/7  output rows per thread item (the height of the register sliding window) of the 3x3, 5x5
//                     and 7x7 specialisations;
//   GENERIC_STRIP     the same for the generic kernels;
//   TAP_CHUNK         taps accumulated in registers per pass of the generic weight-gradient kernel;
//   LARGE_RUN         consecutive taps of one kernel row per thread in depthwise_bwd_weight_large;
//   LARGE_ROWS, LARGE_COLUMNS  output rows and columns per thread item of depthwise_fwd_large and
//                     depthwise_bwd_input_large (columns: a multiple of 16 / sizeof(double), for 16-byte shared loads);
//   STRIDED_ROWS      input pixels per thread of depthwise_bwd_input_strided;
//   PHASED_CELLS      cells (S x S input pixels) per side of a thread item of depthwise_bwd_input_phased;
//   SPREAD_MIN_K      the smallest K whose small-plane instantiations spread their planes over the banks
//                     (AlignedStaging<SPREAD>, ItemLayout<true>);
//   PLANE_BATCH       src elements a thread of the planes kernels' <T, I, K> instantiations loads before it stores;
//   LANES_THREADS     the most threads a block of depthwise_bwd_weight_lanes (its __launch_bounds__);
//   FINISH_ROWS       partial rows a thread of a channel's last block (finish_rows) loads before it adds them.
#if !defined(FWD_COLUMNS) || !defined(STRIP_ROWS_3) || !defined(STRIP_ROWS_5) || !defined(STRIP_ROWS_7) || \
    !defined(GENERIC_STRIP) || !defined(TAP_CHUNK) || !defined(LARGE_RUN) || !defined(LARGE_COLUMNS) ||           \
    !defined(LARGE_ROWS) || !defined(STRIDED_ROWS) || !defined(PHASED_CELLS) ||                                    \
    !defined(SPREAD_MIN_K) || !defined(PLANE_BATCH) || !defined(LANES_THREADS) || !defined(FINISH_ROWS)
#error "depthwise.cu needs the -D options of cupyconv._device.compile_options('depthwise.cu')"
#endif
template <int K> struct StripRows {
  static constexpr int value = K == 3 ? STRIP_ROWS_3 : K == 5 ? STRIP_ROWS_5 : STRIP_ROWS_7;
};

extern __shared__ double depthwise_smem[];  // dynamic shared memory; double keeps it 8-byte aligned

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

// Global loads a thread issues before it stores any of them where the packed persistent kernels from 5x5 on stage
// their planes flat (depthwise_persistent's FLAT): one wait on global memory per batch, not per element.  A
// kernel-only constant (the planner does not depend on it).
constexpr int STAGE_BATCH = 8;
// 16-byte chunks of weights a thread loads before it stores any (stage_weight_chunks): a 32-channel 5x5 unit's 800
// float16 weights are 100 chunks, float32 200, on 64 threads.
constexpr int WEIGHT_CHUNK_BATCH = 2;
// Chunks a thread loads before it stores any where the packed 16-bit 5x5 units stage by chunks (stage_chunks): as many
// as keep 128 registers (NVRTC 13, sm_90: 8 blocks of 64 an SM); float16 at 4 took 152 (6 blocks: a third wave of
// dw-1152-7k5's 2,048), bfloat16 at 2 took 152.
template <typename T> struct ChunkBatch { static constexpr int value = 2; };
template <> struct ChunkBatch<__nv_bfloat16> { static constexpr int value = 1; };
// The same (pairs, one register each) for depthwise_bwd_weight's PAIRS instantiations, staged flat by pairs: as many as
// keep their registers (NVRTC 13, sm_90: 56 for the 3x3, 4 blocks of 256 threads an SM, and 96 for the 5x5, 10 of 64).
// bfloat16 takes one: batches of 2-4 cost it 69 (3x3) and 109-113 (5x5) registers.
template <typename T, int K> struct PairBatch { static constexpr int value = K == 3 ? 2 : 4; };
template <int K> struct PairBatch<__nv_bfloat16, K> { static constexpr int value = 1; };

// ---------------------------------------------------------------------------------------------------------
// Shared pieces of the tiled kernels

// Stage `planes` zero-padded tiles of in_h x in_w elements into shared memory: tile q holds rows
// [y0, y0 + in_h) x columns [x0, x0 + in_w) of channel channel0 + q % planes_per_image of image
// image0 + q / planes_per_image (zeros outside the plane and for images past the batch).  A row is read as
// N-element slots aligned to N in global memory (N > 1: one 16-byte load per fully inside slot), lanes
// running along the row and rows spread over the rest of the block, so the loads are coalesced.
template <int N, typename T, typename I>
__device__ void load_tiles_as(acc_t<T>* tile, const T* __restrict__ src, I images, I image0, int src_channels,
                              int channel0, int planes_per_image, int planes, int in_h, int in_w, int y0, int x0,
                              int height, int width) {
  typedef acc_t<T> A;
  const int shift = N == 1 ? 0 : ((x0 % N) + N) % N;  // x0 - shift is aligned to N
  const int first = x0 - shift;
  const int slots = (shift + in_w + N - 1) / N;
  const int lanes = min(slots, (int)blockDim.x);
  const int rows_per_pass = (int)blockDim.x / lanes;
  if ((int)threadIdx.x >= rows_per_pass * lanes) return;
  int q = 0, r = (int)threadIdx.x / lanes;
  while (r >= in_h) { r -= in_h; ++q; }
  while (q < planes) {
    const I image = image0 + q / planes_per_image;
    const int y = y0 + r;
    const T* row = nullptr;
    if (image < images && y >= 0 && y < height)
      row = src + ((image * src_channels + channel0 + q % planes_per_image) * height + y) * (I)width;
    A* dst = tile + (q * in_h + r) * in_w;
    for (int s = (int)threadIdx.x % lanes; s < slots; s += lanes) {
      const int g = first + s * N;
      A v[N];
      if (row == nullptr) {
#pragma unroll
        for (int e = 0; e < N; ++e) v[e] = A(0);
      } else if (N > 1 && g >= 0 && g + N <= width) {
        const Pack<T, N> p = *reinterpret_cast<const Pack<T, N>*>(row + g);
#pragma unroll
        for (int e = 0; e < N; ++e) v[e] = to_acc(p.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) v[e] = g + e >= 0 && g + e < width ? to_acc(row[g + e]) : A(0);
      }
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const int col = s * N + e - shift;  // relative to x0
        if (col >= 0 && col < in_w) dst[col] = v[e];
      }
    }
    r += rows_per_pass;
    while (r >= in_h) { r -= in_h; ++q; }
  }
}

// load_tiles_as with 16-byte slots when every row start is 16-byte aligned (aligned base, width a multiple of
// the slot), else element by element.  The check is done here, on the real pointer, so no caller can get it
// wrong.
template <typename T, typename I>
__device__ __forceinline__ void load_tiles(acc_t<T>* tile, const T* __restrict__ src, I images, I image0,
                                           int src_channels, int channel0, int planes_per_image, int planes,
                                           int in_h, int in_w, int y0, int x0, int height, int width) {
  constexpr int PACK = 16 / sizeof(T);
  if (width % PACK == 0 && (reinterpret_cast<unsigned long long>(src) & 15) == 0)
    load_tiles_as<PACK, T, I>(tile, src, images, image0, src_channels, channel0, planes_per_image, planes,
                              in_h, in_w, y0, x0, height, width);
  else
    load_tiles_as<1, T, I>(tile, src, images, image0, src_channels, channel0, planes_per_image, planes, in_h,
                           in_w, y0, x0, height, width);
}

// The taps [lo, hi) of one kernel dimension that read inside a plane of `size` for outputs first .. last (along
// that dimension): output o's tap t reads o * stride - pad + t * dilation.  Taps outside it read the staged
// zeros, so skipping them changes nothing but the work: a 31x31 kernel padded 15 on a 14x14 plane has at most
// 14 of its 31 rows (and columns) inside for any output, 961 -> 196 taps.  Only non-negative divisions.
__device__ __forceinline__ void tap_range(int first, int last, int stride, int pad, int dilation, int size, int k,
                                          int& lo, int& hi) {
  const int before = pad - last * stride;               // tap 0 of the last output is `before` rows above the plane
  const int after = size - 1 + pad - first * stride;    // the plane's last row, from tap 0 of the first output
  lo = before <= 0 ? 0 : (before + dilation - 1) / dilation;
  hi = after < 0 ? 0 : min(k, after / dilation + 1);
}

// out[v] += sum_{i,j} w[i][j] * base[(v * stride_h + i * dilation_h) * pitch + j * dilation_w] for a strip
// of V outputs, over the taps i in [i_lo, i_hi), j in [j_lo, j_hi) (tap_range: the others read zeros); w is the
// tap-major (kh, kw) kernel in shared memory.  When the vertical stride equals the vertical dilation, output v's
// tap i reads row (v + i) * stride: a window of V registers then slides down each kernel column, one shared load
// (plus a weight) per V FMAs instead of V (the 31x31 stride-1 case).
template <typename A, int V>
__device__ __forceinline__ void generic_fma(const A* base, int pitch, const A* w, int kernel_w, int i_lo, int i_hi,
                                            int j_lo, int j_hi, int stride_h, int dilation_h, int dilation_w,
                                            A (&out)[V]) {
  if (i_lo >= i_hi) return;  // no row inside (the window below would start past the tile)
  const int step = stride_h * pitch;
  for (int j = j_lo; j < j_hi; ++j) {
    const A* col = base + j * dilation_w;
    if (stride_h == dilation_h) {
      A win[V];
#pragma unroll
      for (int v = 0; v < V; ++v) win[v] = col[(v + i_lo) * step];
      for (int i = i_lo; i < i_hi; ++i) {
        const A wv = w[i * kernel_w + j];
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] += wv * win[v];
        if (i + 1 < i_hi) {
#pragma unroll
          for (int v = 0; v + 1 < V; ++v) win[v] = win[v + 1];
          win[V - 1] = col[(V + i) * step];
        }
      }
    } else {
      for (int i = i_lo; i < i_hi; ++i) {
        const A wv = w[i * kernel_w + j];
        const A* row = col + i * dilation_h * pitch;
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] += wv * row[v * step];
      }
    }
  }
}

// Sum v[0..R) over the whole block in a fixed order (a shuffle tree inside each warp, then the warp totals in
// warp order), so the result never depends on scheduling, and hand total i to store(i, total) (i spread over the
// threads: R may exceed the block).  Every thread of the block must call it; scratch holds
// (blockDim.x / 32) * R values and may be reused as soon as it returns.
template <typename A, int R, typename Store>
__device__ __forceinline__ void block_reduce(A (&v)[R], A* scratch, Store store) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v[i] += __shfl_down_sync(0xffffffffu, v[i], offset);
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < R; ++i) scratch[warp * R + i] = v[i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R; i += blockDim.x) {
    A total = A(0);
    for (int w = 0; w < warps; ++w) total += scratch[w * R + i];
    store(i, total);
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------------------
// Forward and stride-1 input gradient: one tiled convolution from `src` planes to `dst` planes.
//
// Forward (TRANSPOSED false): src = x (C channels), dst = y (C * m); a unit is one output channel co, whose
// tile is staged from input channel co / m, bias fused.  (With m > 1 the m units of one input channel re-read
// its tile, from L2 in practice as they are neighbours in the grid; looping over the m kernels inside a unit
// instead would let the compiler hoist the whole window out of that loop, 150+ registers for 5x5.)
// Input gradient at stride 1 (TRANSPOSED true): src = grad_out (C * m), dst = grad_x (C): grad_x is the
// correlation of grad_out with the flipped kernels, summed over the m output channels of the input channel;
// the unit stages those m tiles together.  pad_top/pad_left are those of the equivalent forward correlation
// src -> dst.  Any geometry (the K x K specialisations are depthwise_persistent's).
template <typename T, typename I, bool TRANSPOSED>
__device__ __forceinline__ void depthwise_tiled(
    const T* __restrict__ src, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ dst,
    I images, int channels, int multiplier, int src_h, int src_w, int dst_h, int dst_w, int kernel_h,
    int kernel_w, int stride_h, int stride_w, int dilation_h, int dilation_w, int pad_top, int pad_left,
    int tile_h, int tile_w, int tiles_x, int tiles_y, int per_block, int has_bias) {
  typedef acc_t<T> A;
  constexpr int V = GENERIC_STRIP;
  const int taps = kernel_h * kernel_w;
  const int in_h = (tile_h - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
  const int in_w = (tile_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
  const int terms = TRANSPOSED ? multiplier : 1;  // kernels (and staged planes per image) summed into one output
  A* tile = reinterpret_cast<A*>(depthwise_smem);
  A* wshared = tile + per_block * terms * in_h * in_w;  // generic only: the unit's `terms` kernels
  const int src_channels = TRANSPOSED ? channels * multiplier : channels;
  const int dst_channels = TRANSPOSED ? channels : channels * multiplier;

  // This thread's item: output column ox_l of strip s of image p of the unit.
  const int strips = tile_h / V;
  const int ox_l = (int)threadIdx.x % tile_w;
  const int s = (int)threadIdx.x / tile_w % strips;
  const int p = (int)threadIdx.x / (tile_w * strips);
  const int tiles = tiles_x * tiles_y;
  const I units = (images + per_block - 1) / per_block * dst_channels * tiles;

  for (I unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int t = (int)(unit % tiles);
    const int d = (int)(unit / tiles % dst_channels);  // the output plane's channel
    const I image0 = unit / tiles / dst_channels * per_block;
    const int oy0 = t / tiles_x * tile_h, ox0 = t % tiles_x * tile_w;
    const int kernel0 = TRANSPOSED ? d * multiplier : d;  // its first kernel, and the first staged channel below
    load_tiles<T, I>(tile, src, images, image0, src_channels, TRANSPOSED ? kernel0 : d / multiplier, terms,
                     per_block * terms, in_h, in_w, oy0 * stride_h - pad_top, ox0 * stride_w - pad_left, src_h,
                     src_w);
    for (int e = threadIdx.x; e < terms * taps; e += blockDim.x) {
      const int tap = e % taps;
      wshared[e] = to_acc(weight[((I)kernel0 + e / taps) * taps + (TRANSPOSED ? taps - 1 - tap : tap)]);
    }
    __syncthreads();

    const I n = image0 + p;
    const int ox = ox0 + ox_l;
    if (p < per_block && n < images && ox < dst_w) {
      A acc[V];
      const A init = !TRANSPOSED && has_bias ? to_acc(bias[d]) : A(0);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = init;
      const int oy_first = oy0 + s * V;
      int i_lo, i_hi, j_lo, j_hi;  // the item's taps that read inside the src plane
      tap_range(oy_first, min(oy_first + V, dst_h) - 1, stride_h, pad_top, dilation_h, src_h, kernel_h, i_lo, i_hi);
      tap_range(ox, ox, stride_w, pad_left, dilation_w, src_w, kernel_w, j_lo, j_hi);
      for (int k = 0; k < terms; ++k) {
        const A* base = tile + ((p * terms + k) * in_h + s * V * stride_h) * in_w + ox_l * stride_w;
        generic_fma<A, V>(base, in_w, wshared + k * taps, kernel_w, i_lo, i_hi, j_lo, j_hi, stride_h, dilation_h,
                          dilation_w, acc);
      }
      T* out = dst + (n * dst_channels + d) * (I)dst_h * dst_w + ox;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int oy = oy0 + s * V + v;
        if (oy < dst_h) out[(I)oy * dst_w] = from_acc<T>(acc[v]);
      }
    }
    __syncthreads();  // the next unit overwrites the tiles
  }
}

// Tiny planes (4x4, 2x2: whole planes of a few dozen elements), any kernel size, stride (forward) and dilation: one
// thread per dst plane, the same src -> dst convolution as depthwise_tiled (TRANSPOSED: the stride-1 input gradient).
// Tiled, such a plane leaves most lanes of a strip idle and pays a unit's set-up for a handful of outputs.  A unit is
// blockDim.x consecutive dst planes (flat over images and channels: one contiguous run of dst, and its src planes
// one contiguous run of src: forward, dst plane P reads src plane P / multiplier; input gradient, dst plane Q reads
// the `multiplier` planes Q * multiplier + t).  The run of src is staged with coalesced element loads, the block's
// kernels likewise (consecutive planes have consecutive kernels, modulo the channels), each thread convolves its plane
// over the taps that land inside it (tap_range per output), its outputs go to shared memory and the block writes
// them back as one coalesced run.  Staged planes are pitched to an odd number of words, so that the 32 threads of a
// warp, each reading the same element of its own plane, hit 32 different banks.  The element -> (plane, offset)
// split of a run is the same in every unit, so it is worked out once per thread (one division), then stepped.
//
// K > 0 (the planner's TINY_KERNELS: square K x K, stride 1, dilation 1, each side's padding of the correlation in
// [0, K - 1], one term): the runtime window's loops cost ~10 instructions a multiply-add (tap_range, index products,
// weights from shared memory), which made a 4x4 plane's 100 products issue-bound at 3-5x the memory floor.  Here the
// src planes are staged zero-padded to (dst_h + K - 1) x (dst_w + K - 1), so that every output reads all K * K taps
// at offsets known at compile time from its window's corner: one shared load and one FMA a tap, the thread's kernel
// in registers.  The padding is zeroed once per block (units only overwrite the interior), an element's padded
// offset comes from a per-block table (`pad_at`), and the src run is staged PLANE_BATCH loads at a time (one wait on
// global memory per batch, not per element).  The planner makes the grid's step a whole number of images where it
// can (`_planes_grid`), so that a thread's dst channel, hence its kernel, is the same in all its units: the kernel
// is then loaded once (else once a unit).
struct PlaneWalk {  // element e = tid, tid + blockDim.x, ... of runs of `size`-element planes: q = e / size, r = e % size
  int q, r, dq, dr, size;
  __device__ __forceinline__ PlaneWalk(int size_) : size(size_) {
    q = (int)threadIdx.x / size, r = (int)threadIdx.x % size;
    dq = (int)blockDim.x / size, dr = (int)blockDim.x % size;
  }
  __device__ __forceinline__ void next() {
    q += dq, r += dr;
    if (r >= size) r -= size, ++q;
  }
};

// One thread's dst plane with a K x K window at stride 1 (depthwise_planes' K > 0): its zero-padded staged src plane
// x (rows of pad_w) correlated with the kernel w into the staged dst plane y.
template <typename A, int K>
__device__ __forceinline__ void fixed_window_plane(const A* x, int pad_w, const A (&w)[K * K], A* y, int dst_h,
                                                   int dst_w, A init) {
  for (int oy = 0; oy < dst_h; ++oy) {
    for (int ox = 0; ox < dst_w; ++ox) {
      const A* window = x + oy * pad_w + ox;
      A acc = init;
#pragma unroll
      for (int i = 0; i < K; ++i) {
#pragma unroll
        for (int jj = 0; jj < K; ++jj) acc += w[i * K + jj] * window[i * pad_w + jj];
      }
      y[oy * dst_w + ox] = acc;
    }
  }
}

// The src planes of at most K x K (the 4x4 planes of a 4x4 window: `planes_in_registers`) go to registers, so that
// the taps read registers at compile-time indices and only the taps that land inside the plane are multiplied (a 4x4
// plane padded by 1: 100 products for its 3 x 3 outputs, not 144 and 144 shared loads).  Whole K x K planes aligned
// to 16 bytes skip the staging: a thread loads its own plane in 16-byte loads (each a warp's full sectors); others
// (the input gradient's 3x3 planes) are staged unpadded by coalesced element loads and read element by element.
// load_plane: plane (h x w, global or staged) into x, zeros past it; `whole`: K x K in 16-byte loads.
template <int K, typename T>
__device__ __forceinline__ void load_plane(acc_t<T> (&x)[K * K], const T* __restrict__ plane, int h, int w,
                                           bool whole) {
  constexpr int E = 16 / sizeof(T);  // elements a 16-byte load
  if constexpr (K * K % E == 0) {
    if (whole) {
#pragma unroll
      for (int c = 0; c < K * K / E; ++c) {
        const Pack<T, E> p = reinterpret_cast<const Pack<T, E>*>(plane)[c];
#pragma unroll
        for (int e = 0; e < E; ++e) x[c * E + e] = to_acc(p.v[e]);
      }
      return;
    }
  }
#pragma unroll
  for (int a = 0; a < K; ++a) {
#pragma unroll
    for (int b = 0; b < K; ++b) x[a * K + b] = a < h && b < w ? to_acc(plane[a * w + b]) : acc_t<T>(0);
  }
}

// dst[0, n) = run[0, n), raw: the consecutive planes of a unit copied flat (the planes in registers that are not
// whole: a thread then reads its own from dst), 16 bytes a load and store where both are 16-byte aligned, else
// element by element (and the last few elements).  No per-element plane walk or conversion.
template <typename T>
__device__ __forceinline__ void stage_flat(T* dst, const T* __restrict__ run, int n) {
  constexpr int E = 16 / sizeof(T);
  int done = 0;
  if ((reinterpret_cast<size_t>(run) | reinterpret_cast<size_t>(dst)) % 16 == 0) {
    constexpr int B = 4;  // loads a thread issues before its stores: one wait on global memory per 4 (a 64-plane unit
                          // of 3x3 planes is 2.25 chunks a thread of 64 in fp32)
    const int chunks = n / E, step = (int)blockDim.x;
    const Pack<T, E>* from = reinterpret_cast<const Pack<T, E>*>(run);
    Pack<T, E>* to = reinterpret_cast<Pack<T, E>*>(dst);
    done = chunks * E;
    for (int c0 = threadIdx.x; c0 < chunks; c0 += B * step) {
      Pack<T, E> v[B];
#pragma unroll
      for (int b = 0; b < B; ++b)
        if (c0 + b * step < chunks) v[b] = from[c0 + b * step];
#pragma unroll
      for (int b = 0; b < B; ++b)
        if (c0 + b * step < chunks) to[c0 + b * step] = v[b];
    }
  }
  for (int e = done + (int)threadIdx.x; e < n; e += blockDim.x) dst[e] = run[e];
}

// Whether a thread's src planes (h x w, at src) go to registers (load_plane): at most K x K, and `whole` (16-byte
// loads) where they are exactly K x K and src is 16-byte aligned (K * K elements a plane keep every plane so).
template <int K, typename T>
__device__ __forceinline__ bool planes_in_registers(const T* src, int h, int w, bool& whole) {
  whole = h == K && w == K && K * K * sizeof(T) % 16 == 0 && reinterpret_cast<size_t>(src) % 16 == 0;
  return h <= K && w <= K;
}

// The outputs of a K x K window over a plane x of at most K x K in registers (zeros past it), and the taps that read
// inside x, at compile-time indices: output (oy, ox) = (u + pad_top, v + pad_left) reads x at (u + i, v + j), u and
// v over [1 - K, K - 1], each output kept where it is inside the out_h x out_w plane (a test the whole block takes
// alike).  in_plane_outputs calls output(oy, ox, u, v) in row order; in_plane_taps calls tap(i * K + j,
// (u + i) * K + v + j) for the taps with u + i and v + j in [0, K), in tap order (fixed_window_plane's).
template <int K, typename Output>
__device__ __forceinline__ void in_plane_outputs(int out_h, int out_w, int pad_top, int pad_left, Output output) {
#pragma unroll
  for (int u = 1 - K; u < K; ++u) {
    const int oy = u + pad_top;
    if (oy < 0 || oy >= out_h) continue;
#pragma unroll
    for (int v = 1 - K; v < K; ++v) {
      const int ox = v + pad_left;
      if (ox >= 0 && ox < out_w) output(oy, ox, u, v);
    }
  }
}

template <int K, typename Tap> __device__ __forceinline__ void in_plane_taps(int u, int v, Tap tap) {
#pragma unroll
  for (int i = u < 0 ? -u : 0; i < (u > 0 ? K - u : K); ++i) {
#pragma unroll
    for (int j = v < 0 ? -v : 0; j < (v > 0 ? K - v : K); ++j) tap(i * K + j, (u + i) * K + v + j);
  }
}

// The forward of such a plane into y (dst_h x dst_w), each output from `init`.
template <typename A, int K>
__device__ __forceinline__ void register_window_plane(const A (&x)[K * K], const A (&w)[K * K], A* y, int dst_h,
                                                      int dst_w, int pad_top, int pad_left, A init) {
  in_plane_outputs<K>(dst_h, dst_w, pad_top, pad_left, [&](int oy, int ox, int u, int v) {
    A acc = init;
    in_plane_taps<K>(u, v, [&](int tap, int at) { acc += w[tap] * x[at]; });
    y[oy * dst_w + ox] = acc;
  });
}

// Stage a run of n elements, planes of at.size elements, into shared planes `pitch` apart, element r of a plane at
// offset pad_at[r] (PADDED; else at r), PLANE_BATCH loads a thread at a time: one wait on global memory per batch,
// not per element (the TINY_KERNELS instantiations).
template <bool PADDED, typename T>
__device__ __forceinline__ void stage_batched(acc_t<T>* dst, const T* __restrict__ run, int n, PlaneWalk at, int pitch,
                                              const int* pad_at) {
  const int step = (int)blockDim.x;
  for (int e0 = threadIdx.x; e0 < n; e0 += PLANE_BATCH * step) {
    T v[PLANE_BATCH];
#pragma unroll
    for (int b = 0; b < PLANE_BATCH; ++b)
      if (e0 + b * step < n) v[b] = run[e0 + b * step];
#pragma unroll
    for (int b = 0; b < PLANE_BATCH; ++b, at.next())
      if (e0 + b * step < n) dst[at.q * pitch + (PADDED ? pad_at[at.r] : at.r)] = to_acc(v[b]);
  }
}

// The K x K kernel of dst channel `channel` (flipped when TRANSPOSED) into registers: 16-byte loads where the weight
// is aligned (a thread's kernel is K * K contiguous elements: element loads took 16 requests of a warp's 32 sectors).
template <typename T, typename I, int K, bool TRANSPOSED>
__device__ __forceinline__ void load_kernel(acc_t<T> (&w)[K * K], const T* __restrict__ weight, I channel) {
  acc_t<T> k[K * K];
  load_plane<K>(k, weight + channel * (K * K), K, K,
                K * K * sizeof(T) % 16 == 0 && reinterpret_cast<size_t>(weight) % 16 == 0);
#pragma unroll
  for (int tap = 0; tap < K * K; ++tap) w[tap] = k[TRANSPOSED ? K * K - 1 - tap : tap];
}

// The launch bounds of depthwise_fwd_planes and depthwise_bwd_weight_planes: blocks of at most 256 threads (the
// planner's), and the <T, I, K> instantiations, whose planes and kernels sit in registers, held to 3 such blocks an SM
// (80 registers: 24 warps, not 16 at the ~128 they take freely; PREDICTED on dw-tiny-4x4k4 fp16: forward 150 -> 133
// us, weight gradient 113 -> 55 at the high end).  Not the input gradient's: at 80 registers it executed 50% more
// instructions (fp32 100 -> 204 us).  Nor the 64-bit-index instantiations: at 80 registers they spilled 8-56 bytes.
// (A named constant: cupyconv/_kernels.py reads the launch bounds' parentheses without nesting.)
template <typename I, int K> constexpr int planes_min_blocks = K && sizeof(I) == 4 ? 3 : 1;

template <typename T, typename I, bool TRANSPOSED, int K = 0>
__device__ __forceinline__ void depthwise_planes(
    const T* __restrict__ src, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ dst,
    I images, int channels, int multiplier, int src_h, int src_w, int dst_h, int dst_w, int kernel_h, int kernel_w,
    int stride_h, int stride_w, int dilation_h, int dilation_w, int pad_top, int pad_left, int has_bias) {
  typedef acc_t<T> A;
  const int taps = kernel_h * kernel_w;
  const int terms = TRANSPOSED ? multiplier : 1;  // src planes (and kernels) per dst plane
  const int dst_channels = TRANSPOSED ? channels : channels * multiplier;
  const int src_size = src_h * src_w, dst_size = dst_h * dst_w, kernel_size = terms * taps;
  const int pad_w = K ? dst_w + K - 1 : src_w;          // K: staged planes zero-padded to pad_w columns
  const int staged_size = K ? (dst_h + K - 1) * pad_w : src_size;
  const int src_pitch = staged_size | 1, dst_pitch = dst_size | 1, w_pitch = kernel_size | 1;  // odd: no conflicts
  const int per_block = (int)blockDim.x;
  A* xs = reinterpret_cast<A*>(depthwise_smem);        // per_block * terms planes (forward: at most per_block)
  A* ws = xs + per_block * terms * src_pitch;          // per_block kernels of `terms` x taps (K: in registers)
  A* ys = ws + (K ? 0 : per_block * w_pitch);          // per_block dst planes
  int* pad_at = reinterpret_cast<int*>(ys + per_block * dst_pitch);  // K: src element -> offset in its staged plane
  const I planes = images * dst_channels;
  const I weights = (I)dst_channels * kernel_size;      // the whole weight tensor, in kernel order
  const PlaneWalk src_walk(src_size), w_walk(kernel_size), dst_walk(dst_size);
  A w[K ? K * K : 1];  // K: the thread's kernel
  const I step = (I)gridDim.x * per_block;
  const bool same_kernel = step % dst_channels == 0 || step >= planes;  // K: every unit of the thread, one kernel
  bool whole = false;  // K, in registers: 16-byte loads of whole planes
  const bool in_registers = K > 0 && planes_in_registers<K ? K : 1>(src, src_h, src_w, whole);
  if constexpr (K > 0) {
    if (!in_registers) {
      for (int e = threadIdx.x; e < per_block * src_pitch; e += per_block) xs[e] = A(0);
      for (int e = threadIdx.x; e < src_size; e += per_block)
        pad_at[e] = (e / src_w + pad_top) * pad_w + e % src_w + pad_left;
    }
    if (same_kernel)
      load_kernel<T, I, K, TRANSPOSED>(w, weight, ((I)blockIdx.x * per_block + threadIdx.x) % dst_channels);
    __syncthreads();
  }

  for (I p0 = (I)blockIdx.x * per_block; p0 < planes; p0 += (I)gridDim.x * per_block) {
    const int count = (int)min((I)per_block, planes - p0);
    const I s0 = TRANSPOSED ? p0 * terms : p0 / multiplier;  // the unit's first src plane
    const int src_count = TRANSPOSED ? count * terms : (int)((p0 + count - 1) / multiplier - s0 + 1);
    if (!whole) {
      const T* run = src + s0 * src_size;
      PlaneWalk at = src_walk;
      if constexpr (K > 0) {
        if (in_registers)
          stage_flat(reinterpret_cast<T*>(xs), run, src_count * src_size);
        else
          stage_batched<true>(xs, run, src_count * src_size, at, src_pitch, pad_at);
      } else {
        for (int e = threadIdx.x; e < src_count * src_size; e += per_block, at.next())
          xs[at.q * src_pitch + at.r] = to_acc(run[e]);
      }
    }
    if constexpr (K > 0) {
      if (!same_kernel && (int)threadIdx.x < count)
        load_kernel<T, I, K, TRANSPOSED>(w, weight, (p0 + threadIdx.x) % dst_channels);
    } else {
      // The kernels of dst planes p0 .. p0 + count - 1: weights from (p0 % dst_channels) * kernel_size on, wrapping
      // at the end of the tensor (planes of the next image).
      const I first = p0 % dst_channels * (I)kernel_size;
      PlaneWalk at = w_walk;
      for (int e = threadIdx.x; e < count * kernel_size; e += per_block, at.next()) {
        I g = first + e;
        if (g >= weights) g %= weights;
        ws[at.q * w_pitch + at.r] = to_acc(weight[g]);
      }
    }
    if (!whole) __syncthreads();

    const int j = (int)threadIdx.x;
    if (j < count) {
      const I plane = p0 + j;
      const A init = !TRANSPOSED && has_bias ? to_acc(bias[(int)(plane % dst_channels)]) : A(0);
      const int q0 = TRANSPOSED ? j * terms : (int)((p0 + j) / multiplier - s0);  // the thread's first src plane
      if constexpr (K > 0) {
        if (in_registers) {
          A x[K * K];
          if (whole)
            load_plane<K>(x, src + (s0 + q0) * src_size, K, K, true);
          else
            load_plane<K>(x, reinterpret_cast<const T*>(xs) + q0 * src_size, src_h, src_w, false);
          register_window_plane<A, K>(x, w, ys + j * dst_pitch, dst_h, dst_w, pad_top, pad_left, init);
        } else {
          fixed_window_plane<A, K>(xs + q0 * src_pitch, pad_w, w, ys + j * dst_pitch, dst_h, dst_w, init);
        }
      } else {
        const A* w = ws + j * w_pitch;
        for (int oy = 0; oy < dst_h; ++oy) {
          int i_lo, i_hi;
          tap_range(oy, oy, stride_h, pad_top, dilation_h, src_h, kernel_h, i_lo, i_hi);
          for (int ox = 0; ox < dst_w; ++ox) {
            int j_lo, j_hi;
            tap_range(ox, ox, stride_w, pad_left, dilation_w, src_w, kernel_w, j_lo, j_hi);
            A acc = init;
            for (int t = 0; t < terms; ++t) {
              const A* x = xs + (q0 + t) * src_pitch;
              const int origin = (oy * stride_h - pad_top) * src_w + ox * stride_w - pad_left;  // tap (0, 0)'s offset
              const A* wt = w + t * taps;
              for (int i = i_lo; i < i_hi; ++i) {
                for (int jj = j_lo; jj < j_hi; ++jj) {
                  const int tap = i * kernel_w + jj;
                  acc += wt[TRANSPOSED ? taps - 1 - tap : tap] * x[origin + i * dilation_h * src_w + jj * dilation_w];
                }
              }
            }
            ys[j * dst_pitch + oy * dst_w + ox] = acc;
          }
        }
      }
    }
    __syncthreads();
    {
      T* run = dst + p0 * dst_size;
      PlaneWalk at = dst_walk;
      for (int e = threadIdx.x; e < count * dst_size; e += per_block, at.next())
        run[e] = from_acc<T>(ys[at.q * dst_pitch + at.r]);
    }
    __syncthreads();  // the next unit overwrites the staged planes
  }
}

// Forward, K x K kernel (K = 3, 5, 7), stride S (1, 2), dilation 1, any padding: a persistent kernel.
//
// The grid is capped (cupyconv/ops/depthwise.py: FORWARD_BLOCKS) and each block walks its units
// blockIdx.x, blockIdx.x + gridDim.x, ... so everything that does not depend on the unit is worked out once per
// block: the thread's output item, its staging chunks, and the unit number as mixed-radix digits (tile column,
// tile row, kernel of the channel, channel, image group), advanced by the digits of gridDim.x with one carry
// each, so no division runs inside the loop.
//
// A thread item is a block of V = STRIP_ROWS_K rows by U = FWD_COLUMNS columns of outputs: a register window
// slides down it, each staged row segment ((U - 1) * S + K values) read once with 16-byte shared loads and fed
// to up to U * ceil(K / S) outputs, and each output row of the item is one U-element store (16 bytes for
// float32) where the plane's rows are aligned.  The staged tile is stored from column x0 (row pitch a multiple of
// 16 bytes) so that those shared loads are aligned, in chunks of C = 16 / sizeof(A) columns, one 16-byte shared
// store each: a chunk is cut from the two C-element global slots aligned in memory that hold it (two 16-byte loads
// in float32, 8-byte in the 16-bit types; zeros for slots outside the plane; element loads with zero padding on
// rows that are not aligned).
__device__ __forceinline__ void next_digit(int& digit, int step, int radix, int& carry) {
  digit += step + carry;
  carry = digit >= radix;
  if (carry) digit -= radix;
}

// row[0..L) = src[0..L) with 16-byte loads (then a pair, then a single); src is 16-byte aligned.
template <typename A, int L> __device__ __forceinline__ void load_row(const A* src, A (&row)[L]) {
  constexpr int C = 16 / sizeof(A), FULL = L / C * C, REST = L - FULL;
#pragma unroll
  for (int c = 0; c < FULL; c += C) {
    const Pack<A, C> p = *reinterpret_cast<const Pack<A, C>*>(src + c);
#pragma unroll
    for (int e = 0; e < C; ++e) row[c + e] = p.v[e];
  }
  if constexpr (REST >= 2) {
    const Pack<A, 2> p = *reinterpret_cast<const Pack<A, 2>*>(src + FULL);
    row[FULL] = p.v[0];
    row[FULL + 1] = p.v[1];
  }
  if constexpr (REST % 2 == 1) row[L - 1] = src[L - 1];
}

// row[0..L) = columns 0..L of a row staged de-interleaved (AlignedStaging's SPLIT): the evens from src, the odds from
// src + odd0, each half with load_row's 16-byte loads, put back in column order in registers.
template <typename A, int L>
__device__ __forceinline__ void load_split_row(const A* src, int odd0, A (&row)[L]) {
  A even[(L + 1) / 2], odd[L / 2];
  load_row<A, (L + 1) / 2>(src, even);
  load_row<A, L / 2>(src + odd0, odd);
#pragma unroll
  for (int e = 0; e < L; ++e) row[e] = e % 2 == 0 ? even[e / 2] : odd[e / 2];
}

// out[v][u] += w[i][j] * row[u * S + j] for the outputs of a V x U block whose tap row i = r - v * S is row r (r:
// a constant once unrolled).
template <typename A, int K, int S, int V, int U, int L>
__device__ __forceinline__ void row_fma(int r, const A (&row)[L], const A (&w)[K][K], A (&out)[V][U]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = r - v * S;
    if (i >= 0 && i < K) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int j = 0; j < K; ++j) out[v][u] += w[i][j] * row[u * S + j];
      }
    }
  }
}

// out[v][u] += sum_{i,j} w[i][j] * x[v * S + i][u * S + j] for a V x U block of outputs, the rows of x read in order
// by load_rows(r, row) (whatever the staging: the same products in the same order).
template <typename A, int K, int S, int V, int U, typename LoadRows>
__device__ __forceinline__ void block_fma(const A (&w)[K][K], A (&out)[V][U], LoadRows load_rows) {
  constexpr int L = (U - 1) * S + K;
#pragma unroll
  for (int r = 0; r < (V - 1) * S + K; ++r) {
    A row[L];
    load_rows(r, row);
    row_fma<A, K, S, V, U>(r, row, w, out);
  }
}

// The staging of the persistent kernels (depthwise_persistent, depthwise_bwd_weight<K, S>), worked out once per
// block.  A tile row is stored from column x0 with a pitch of whole 16-byte chunks of C elements.  Rows that are
// 16-byte aligned in global memory are staged by chunks: this thread's are chunk0 (+ lanes ...) of the unit's rows
// row0, row0 + rows_per_pass, ... (plane q = row / in_h), each one 16-byte shared store cut from the two C-element
// global slots aligned in memory that hold it (a slot outside the plane: zeros, no load).  Other rows
// (a plane width that is not a multiple of C: 7, 14) are staged element by element, lanes along the row, so that a
// warp's load reads consecutive elements (per chunk, its C element loads would each touch every row the warp
// covers).
//
// Staged planes are `plane` elements apart: in_h * pitch, with SPREAD (small planes, narrow tiles) rounded up to be
// congruent to span = tile_w * S (the columns a row of thread items reads) modulo a bank row of 128 bytes.  Their
// kernels lay their thread items out column group fastest, then plane, then strip (ItemLayout<true>), so lane l's
// 16-byte shared loads start l * U * S elements (modulo a bank row) after lane 0's whichever plane it is in: at
// S = 1 the 8 lanes of a quarter warp cover the 32 banks once (one wavefront per quarter; the next strip of the same
// plane, V rows of a 16-byte pitch down, lands on lane 0's banks: two).  The planner's _forward_staging mirrors
// pitch and plane.
//
// PAIRS (depthwise_bwd_weight's small-plane instantiations for 16-bit data, planned where the plane width is even but
// not whole chunks: 14x14): `pairs` says whether the rows are 2-element slots aligned in memory, which the kernel then
// stages flat by pairs itself (its FLAT); otherwise element by element as above.
//
// SPLIT > 0 (the per-image stride-2 weight gradient, SPLIT = its strips' V * S rows): each staged row is
// stored de-interleaved, its even columns (relative to x0) first and its odd ones from `odd0` on (each half whole
// chunks), so that a thread whose outputs read columns 2 apart reads them as consecutive words (load_split_row), and
// each run of SPLIT rows starts `skew` = tile_w (modulo a bank row) elements after the last: lane l of a row of
// groups_x items reads chunk l mod 8 of a bank row whichever strip it is in, so a quarter warp's 16-byte loads take
// one wavefront (interleaved rows put neighbouring lanes 8 columns, 2 chunks, apart, and the next strip, V * S rows of
// a 16-byte pitch down, on lane 0's banks: 6.5 wavefronts a warp's load on dw-96-112s2).
template <typename T, typename I, bool SPREAD, bool PAIRS = false, int SPLIT = 0> struct AlignedStaging {
  typedef acc_t<T> A;
  static constexpr int C = 16 / sizeof(A);  // elements per 16-byte shared access, and per staged chunk
  static constexpr int BANK_ROW = 128 / sizeof(A);  // elements per row of the 32 four-byte banks
  static_assert(!(SPLIT && PAIRS), "SPLIT stages by chunks or elements");
  int in_h, in_w, pitch, plane, chunks, lanes, chunk0, q0, r0, pass_q, pass_r, odd0, skew;
  bool stager, rows_aligned, pairs;

  __device__ __forceinline__ AlignedStaging(const T* src, int width, int in_h_, int in_w_, int span)
      : in_h(in_h_), in_w(in_w_) {
    // the planner's _forward_staging: SPLIT, ceil(in_w / 2) even columns, then floor(in_w / 2) odd ones
    odd0 = SPLIT ? ((in_w + 1) / 2 + C - 1) / C * C : 0;
    pitch = SPLIT ? odd0 + (in_w / 2 + C - 1) / C * C : (in_w + C - 1) / C * C;
    skew = SPLIT ? (span / 2) & (BANK_ROW - 1) : 0;  // span / 2: tile_w
    plane = in_h * pitch + (SPREAD ? (span - in_h * pitch) & (BANK_ROW - 1) : 0) + (SPLIT ? in_h / SPLIT * skew : 0);
    rows_aligned = width % C == 0 && (reinterpret_cast<unsigned long long>(src) % (C * sizeof(T))) == 0;
    chunks = SPLIT ? (in_w + C - 1) / C : pitch / C;  // SPLIT: those that hold a column below in_w
    pairs = PAIRS && !rows_aligned && width % 2 == 0 &&
            (reinterpret_cast<unsigned long long>(src) % (2 * sizeof(T))) == 0;
    lanes = min(rows_aligned ? chunks : in_w, (int)blockDim.x);  // chunks, or elements, of a row at a time
    const int rows_per_pass = (int)blockDim.x / lanes;
    stager = (int)threadIdx.x < rows_per_pass * lanes;
    chunk0 = (int)threadIdx.x % lanes;
    q0 = (int)threadIdx.x / lanes / in_h, r0 = (int)threadIdx.x / lanes % in_h;
    pass_q = rows_per_pass / in_h, pass_r = rows_per_pass % in_h;
  }

  // Where row r of staged plane q starts in the tile (the same sum both ways without SPREAD, written as before it,
  // whose code NVRTC 13 compiles 2% shorter in the large-plane kernels).
  __device__ __forceinline__ int offset(int q, int r) const {
    if constexpr (SPLIT > 0) return q * plane + r * pitch + r / SPLIT * skew;
    return SPREAD ? q * plane + r * pitch : (q * in_h + r) * pitch;
  }

  // Stage `planes` tiles of rows [y0, y0 + in_h) from column x0: plane q is the height x width plane that
  // plane_of(q) points at (nullptr: none, zeros; zeros outside the plane too).
  template <typename PlaneOf>
  __device__ __forceinline__ void stage(A* tile, int planes, int y0, int x0, int height, int width,
                                        PlaneOf plane_of) const {
    if (!stager) return;
    const int shift = x0 & (C - 1);  // x0 mod C, also for x0 < 0: aligned slots start at x0 - shift
    int q = q0, r = r0;
    while (q < planes) {
      const int yy = y0 + r;
      const T* row = nullptr;
      if (yy >= 0 && yy < height) {
        row = plane_of(q);
        if (row != nullptr) row += yy * (I)width;
      }
      A* dst = tile + offset(q, r);  // dst[i]: column x0 + i
      if (!rows_aligned) {
        for (int i = chunk0; i < in_w; i += lanes) {
          const int col = x0 + i;
          const A v = row != nullptr && col >= 0 && col < width ? to_acc(row[col]) : A(0);
          dst[SPLIT ? (i & 1 ? odd0 : 0) + (i >> 1) : i] = v;
        }
      }
      for (int chunk = chunk0; rows_aligned && chunk < chunks; chunk += lanes) {
        const int col = x0 + chunk * C, slot = col - shift;
        // The row is whole aligned slots (rows_aligned), so each of the two is inside the plane or all padding: one
        // vector load or zeros, also at the plane's edges (element loads there made a warp run both paths).
        Pack<T, C> a, b;
#pragma unroll
        for (int e = 0; e < C; ++e) a.v[e] = b.v[e] = from_acc<T>(A(0));
        if (row != nullptr && slot >= 0 && slot < width) a = *reinterpret_cast<const Pack<T, C>*>(row + slot);
        if (row != nullptr && slot + C >= 0 && slot + C < width)
          b = *reinterpret_cast<const Pack<T, C>*>(row + slot + C);
        T t[C];
#pragma unroll
        for (int m = 0; m < C; ++m) {  // t = elements shift .. shift + C - 1 of a, b (shift is uniform)
          if (m == shift) {
#pragma unroll
            for (int e = 0; e < C; ++e) t[e] = e + m < C ? a.v[e + m] : b.v[e + m - C];
          }
        }
        if constexpr (SPLIT) {  // the chunk's even columns to dst[h ..], its odd ones to dst[odd0 + h ..]
          Pack<A, C / 2> even, odd;
#pragma unroll
          for (int e = 0; e < C / 2; ++e) even.v[e] = to_acc(t[2 * e]), odd.v[e] = to_acc(t[2 * e + 1]);
          const int h = chunk * (C / 2);  // a half past its end holds only columns from in_w on: not stored
          if (h < odd0) *reinterpret_cast<Pack<A, C / 2>*>(dst + h) = even;
          if (h < pitch - odd0) *reinterpret_cast<Pack<A, C / 2>*>(dst + odd0 + h) = odd;
        } else {
          Pack<A, C> packed;
#pragma unroll
          for (int e = 0; e < C; ++e) packed.v[e] = to_acc(t[e]);
          *reinterpret_cast<Pack<A, C>*>(dst + chunk * C) = packed;
        }
      }
      q += pass_q, r += pass_r;
      if (r >= in_h) r -= in_h, ++q;
    }
  }
};

// A thread's output item in the persistent kernels' units: columns ox_l .. ox_l + U - 1 of strip s (rows s * V ..)
// of plane p; `valid` is false for the threads past the per_block * strips * groups items of a unit.  Column groups
// run fastest, then (PLANES_FIRST) planes, then strips, so that the lanes of a quarter warp read different banks
// (AlignedStaging says why): for small planes, whose row of items spans fewer than 32 columns.  Otherwise strips
// come before planes: on large planes a quarter warp mostly stays in one row of items, and that layout's code is
// 3-5% fewer instructions and registers (NVRTC 13, sm_90, the 3x3 forward).
template <bool PLANES_FIRST> struct ItemLayout {
  int ox_l, p, s;
  bool valid;
  __device__ __forceinline__ ItemLayout(int tile_w, int tile_h, int U, int V, int per_block) {
    const int groups_x = tile_w / U, strips = tile_h / V;
    ox_l = (int)threadIdx.x % groups_x * U;
    if (PLANES_FIRST) {
      p = (int)threadIdx.x / groups_x % per_block;
      s = (int)threadIdx.x / (groups_x * per_block);
      valid = s < strips;
    } else {
      s = (int)threadIdx.x / groups_x % strips;
      p = (int)threadIdx.x / (groups_x * strips);
      valid = p < per_block;
    }
  }
};

// w = the K x K kernel at wk, or (FLIPPED) the same kernel rotated by 180 degrees.
template <int K, bool FLIPPED, typename T, typename A>
__device__ __forceinline__ void load_kernel(const T* wk, A (&w)[K][K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) {
#pragma unroll
    for (int j = 0; j < K; ++j) w[i][j] = to_acc(wk[FLIPPED ? K * K - 1 - (i * K + j) : i * K + j]);
  }
}

// dst[0..count) = src[0..count) converted to T (src: shared memory, 16-byte aligned), by the whole block: one
// 16-byte store a lane where dst is 16-byte aligned (lanes on consecutive chunks), element stores otherwise and
// for the tail.
template <typename T, typename I>
__device__ __forceinline__ void store_run(T* __restrict__ dst, const acc_t<T>* src, int count) {
  typedef acc_t<T> A;
  constexpr int W = 16 / sizeof(T), VA = 16 / sizeof(A);  // elements per 16-byte global, shared access
  int vector_end = 0;
  if ((reinterpret_cast<unsigned long long>(dst) & 15) == 0) {
    vector_end = count / W * W;
    for (int e = (int)threadIdx.x * W; e < vector_end; e += (int)blockDim.x * W) {
      Pack<T, W> packed;
#pragma unroll
      for (int h = 0; h < W; h += VA) {
        const Pack<A, VA> a = *reinterpret_cast<const Pack<A, VA>*>(src + e + h);
#pragma unroll
        for (int i = 0; i < VA; ++i) packed.v[h + i] = from_acc<T>(a.v[i]);
      }
      *reinterpret_cast<Pack<T, W>*>(dst + e) = packed;
    }
  }
  for (int e = vector_end + (int)threadIdx.x; e < count; e += (int)blockDim.x) dst[e] = from_acc<T>(src[e]);
}

// A flat walk over a run of whole w x h planes, consecutive in memory (the packed units' src planes): element
// e = threadIdx.x, + blockDim.x, ... of the run is column x of row y of its plane, and `cell` is where that
// element sits in the staged tiles (row y + top, column x + left of its staged plane; planes `plane`, rows `pitch`
// elements apart).  The split of e is worked out once per block (the divisions), then stepped by blockDim.x with
// one carry per digit.
struct RunWalk {
  int x = 0, y = 0, q = 0, cell = 0, dx = 0, dy = 0, dq = 0, dcell = 0;  // q: the element's plane of the run
  RunWalk() = default;  // kernels without FLAT (whose planes may be too large for an int product)
  __device__ __forceinline__ RunWalk(int w, int h, int pitch, int plane, int top, int left)
      : RunWalk(w, h, pitch, plane, top, left, (int)threadIdx.x, (int)blockDim.x) {}
  // The walk from element e in steps of `step` elements.
  __device__ __forceinline__ RunWalk(int w, int h, int pitch, int plane, int top, int left, int e, int step) {
    const int size = w * h;
    y = e % size / w, x = e % w, q = e / size;
    cell = q * plane + (y + top) * pitch + x + left;
    dy = step % size / w, dx = step % w, dq = step / size;
    dcell = dq * plane + dy * pitch + dx;
  }
  __device__ __forceinline__ void next(int w, int h, int pitch, int plane) {
    x += dx, y += dy, q += dq, cell += dcell;
    if (x >= w) x -= w, ++y, cell += pitch - w;
    if (y >= h) y -= h, ++q, cell += plane - h * pitch;
  }
};

// Stage elements [0, count) of a RunWalk's run into the tiles at their cells (those inside in_h x in_w staged rows
// and columns; the others, and the halo, are left as they are): element e is load(e, at), at its walk.  A thread
// issues the loads of B elements before it stores any, the values kept in T and converted at the store, so that
// nothing waits on a load before the last of the batch is issued: one wait on global memory a batch.  E > 1: an
// element of the run is E consecutive values of one row (the walk's w is the row's width / E), load returns a
// Pack<T, E>, and it is staged where all E columns are inside (the caller sees that none is cut by the edge).
template <typename T, int E> struct RunValue { typedef Pack<T, E> type; };  // what stage_run's load returns
template <typename T> struct RunValue<T, 1> { typedef T type; };
template <int B, typename T, int E = 1, typename Load>
__device__ __forceinline__ void stage_run(acc_t<T>* tile, RunWalk at, int count, int w, int h, int pitch, int plane,
                                          int top, int left, int in_h, int in_w, Load load) {
  for (int e = (int)threadIdx.x; e < count;) {
    typename RunValue<T, E>::type v[B];
    int cell[B];
#pragma unroll
    for (int b = 0; b < B; ++b, e += (int)blockDim.x, at.next(w, h, pitch, plane)) {
      const int row = at.y + top, col = at.x * E + left;
      const bool inside = e < count && row >= 0 && row < in_h && col >= 0 && col + E - 1 < in_w;
      cell[b] = inside ? at.cell + (E - 1) * at.x : -1;
      if (inside) v[b] = load(e, at);
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if constexpr (E == 1) {
        if (cell[b] >= 0) tile[cell[b]] = to_acc(v[b]);
      } else if (cell[b] >= 0) {
#pragma unroll
        for (int k = 0; k < E; ++k) tile[cell[b] + k] = to_acc(v[b].v[k]);
      }
    }
  }
}

// Elements of run[0, count) before its first 16-byte boundary (the chunked stagings' head).
template <typename T> __device__ __forceinline__ int run_head(const T* run, int count) {
  return min(count, (int)((16 - (reinterpret_cast<unsigned long long>(run) & 15)) & 15) / (int)sizeof(T));
}

// Stage elements [0, count) of a run of whole w x h planes, consecutive in memory, into the tiles (plane q, row y,
// column x at q * plane + (y + top) * pitch + x + left; every element lands inside them: the caller checks that the
// planes fit).  The run is read by 16-byte chunks of C elements from its first 16-byte boundary, a thread issuing
// the loads of B chunks before it stores any (one wait a batch); each chunk's C elements go to their cells from a
// pointer that jumps after the elements that end a row or a plane (bit masks worked out once a chunk: 4-6 instructions
// an element, where stepping a row and plane carry an element took ~10), the chunk's start by a RunWalk of
// C * blockDim.x elements a step.  By elements (stage_run), a 7x7 plane's element cost a warp ~45 instructions (the
// walk's carries, the in-tile test, its load and store).  (A 7x7 unit of 32 float16 planes: 196 chunks, 3-4 a thread
// of 64.)  The elements before the first boundary and after the last whole chunk (under C each) take a lane each.
template <int B, typename T>
__device__ __forceinline__ void stage_chunks(acc_t<T>* tile, const T* __restrict__ run, int count, int w, int h,
                                             int pitch, int plane, int top, int left) {
  constexpr int C = 16 / sizeof(T);
  const int head = run_head(run, count);
  const int chunks = (count - head) / C, tail0 = head + chunks * C;
  const int t = (int)threadIdx.x, singles = head + count - tail0;
  if (t < singles) {  // the head and the tail: a division each, under 2 C lanes
    const int e = t < head ? t : tail0 + t - head, size = w * h, r = e % size;
    tile[e / size * plane + (r / w + top) * pitch + r % w + left] = to_acc(run[e]);
  }
  const Pack<T, C>* src = reinterpret_cast<const Pack<T, C>*>(run + head);
  RunWalk at(w, h, pitch, plane, top, left, head + t * C, (int)blockDim.x * C);
  const int row_jump = pitch - w, plane_jump = plane - h * pitch;  // past a row's last element, a plane's (more)
  // Rows or planes shorter than a chunk end more than once in it: bits n - 1, 2n - 1, ... (under 32) of a pattern
  // that a chunk shifts by its first element's place in the row (plane).
  const int size = w * h;
  unsigned row_pattern = 0, plane_pattern = 0;
  for (int k = w - 1; w < C && k < 32; k += w) row_pattern |= 1u << k;
  for (int k = size - 1; size < C && k < 32; k += size) plane_pattern |= 1u << k;
  for (int c = t; c < chunks;) {
    Pack<T, C> v[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (c + b * (int)blockDim.x < chunks) v[b] = src[c + b * (int)blockDim.x];
    }
#pragma unroll
    for (int b = 0; b < B; ++b, c += (int)blockDim.x, at.next(w, h, pitch, plane)) {
      if (c < chunks) {
        // Bit k of row_ends (plane_ends): element k is the last of its row (plane); the cell pointer jumps there.
        const int row_end = w - 1 - at.x, at_plane = at.y * w + at.x, plane_end = size - 1 - at_plane;  // the first
        const unsigned row_ends = w < C ? row_pattern >> at.x : row_end < C ? 1u << row_end : 0u;
        const unsigned plane_ends = size < C ? plane_pattern >> at_plane : plane_end < C ? 1u << plane_end : 0u;
        acc_t<T>* cell = tile + at.cell;
#pragma unroll
        for (int k = 0; k < C; ++k) {
          cell[k] = to_acc(v[b].v[k]);
          if (row_ends >> k & 1) cell += row_jump;
          if (plane_ends >> k & 1) cell += plane_jump;
        }
      }
    }
  }
}

// The per-image stride-2 forward (depthwise_fwd<T, I, K, 2>, neither PACK nor SPREAD) stages nothing: a stride-2
// row feeds each output once per tap row, so staging it only moved it through shared memory (a row's loads waited
// before its stores, 183 waits a warp on dw-96-112s2 fp16).  A thread reads its rows straight from global memory
// into registers instead: out[v][u] += w[i][j] * x[iy0 + 2v + i][ix0 + 2u + j] for a V x U block of outputs
// (iy0 = 2 oy - pad_top, ix0 = 2 ox - pad_left), the same products in the same order as block_fma.  Where
// pad_left = H = (K - 1) / 2 and the rows are whole 16-byte chunks (FAST), a row's L = 2U + K - 2 columns are its 2U
// own ones from 2 ox (ox a multiple of U: 16-byte aligned, so 16-byte loads, each chunk wholly inside or past the row)
// and a halo of H columns before them and H - 1 after, which are its neighbouring lanes' own columns: taken by
// shuffles (`left`, `right`: the lane beside it holds the item beside it), else loaded singly (loaded singly
// everywhere, a warp's halo loads, one a lane 2U elements apart, requested as many sectors as its chunk loads: fp32
// 35.3M sectors on dw-96-112s2 where the shuffles leave 26.1M).
// Other paddings and rows load their L columns element by element.  Rows are loaded in batches of DirectBatch rows
// before any is used: one wait on global memory a batch.  Every lane of a warp runs it (the shuffles): a thread
// without an item passes plane = nullptr, and reads zeros.
template <typename T, int K> struct DirectBatch {  // rows a batch: about 48 registers of raw data
  static constexpr int L = 2 * FWD_COLUMNS + K - 2, R = 2 * StripRows<K>::value + K - 2;
  static constexpr int value = R < 192 / (L * (int)sizeof(T)) ? R : 192 / (L * (int)sizeof(T));
};
template <bool FAST, typename T, int L>
__device__ __forceinline__ void direct_row(const T* __restrict__ row, int ix0, int width, bool left, bool right,
                                           T (&x)[L]) {
  constexpr int C = 16 / sizeof(T), H = FAST ? (L - 2 * FWD_COLUMNS + 1) / 2 : 0;
  const T zero = from_acc<T>(acc_t<T>(0));
  if constexpr (FAST) {
#pragma unroll
    for (int e = 0; e < H; ++e) {
      x[e] = row != nullptr && !left && ix0 + e >= 0 && ix0 + e < width ? row[ix0 + e] : zero;
    }
#pragma unroll
    for (int c = 0; c < 2 * FWD_COLUMNS; c += C) {
      Pack<T, C> p;
#pragma unroll
      for (int e = 0; e < C; ++e) p.v[e] = zero;
      if (row != nullptr && ix0 + H + c < width) p = *reinterpret_cast<const Pack<T, C>*>(row + ix0 + H + c);
#pragma unroll
      for (int e = 0; e < C; ++e) x[H + c + e] = p.v[e];
    }
#pragma unroll
    for (int e = H + 2 * FWD_COLUMNS; e < L; ++e) {
      x[e] = row != nullptr && !right && ix0 + e < width ? row[ix0 + e] : zero;
    }
  } else {
#pragma unroll
    for (int e = 0; e < L; ++e) {
      const int col = ix0 + e;
      x[e] = row != nullptr && col >= 0 && col < width ? row[col] : zero;
    }
  }
}

template <bool FAST, typename T, typename I, int K, int V, int U>
__device__ __forceinline__ void direct_fma(const T* __restrict__ plane, int height, int width, int iy0, int ix0,
                                           bool left, bool right, const acc_t<T> (&w)[K][K], acc_t<T> (&out)[V][U]) {
  constexpr int L = 2 * (U - 1) + K, R = 2 * (V - 1) + K, B = DirectBatch<T, K>::value, H = (K - 1) / 2;
  static_assert(U == FWD_COLUMNS && 2 * U % (16 / sizeof(T)) == 0, "a row's own columns are whole 16-byte chunks");
#pragma unroll
  for (int r0 = 0; r0 < R; r0 += B) {
    T x[B][L];
#pragma unroll
    for (int b = 0; b < B && r0 + b < R; ++b) {
      const int iy = iy0 + r0 + b;
      direct_row<FAST>(plane != nullptr && iy >= 0 && iy < height ? plane + iy * (I)width : nullptr, ix0, width,
                       left, right, x[b]);
    }
#pragma unroll
    for (int b = 0; b < B && r0 + b < R; ++b) {
      acc_t<T> row[L];
#pragma unroll
      for (int e = 0; e < L; ++e) row[e] = to_acc(x[b][e]);
      if constexpr (FAST) {  // the halo: the left lane's last H own columns, the right lane's first H - 1
#pragma unroll
        for (int e = 0; e < H; ++e) {
          const acc_t<T> v = __shfl_up_sync(0xffffffffu, row[2 * U + e], 1);
          if (left) row[e] = v;
        }
#pragma unroll
        for (int e = 0; e < H - 1; ++e) {
          const acc_t<T> v = __shfl_down_sync(0xffffffffu, row[H + e], 1);
          if (right) row[H + 2 * U + e] = v;
        }
      }
      row_fma<acc_t<T>, K, 2, V, U>(r0 + b, row, w, out);
    }
  }
}

// dst[0, count) = run[0, count) converted to acc_t<T>, by the whole block (the packed 5x5 units' weights, one
// contiguous run): 16-byte loads from the run's first 16-byte boundary, a thread issuing B of them before it stores
// any (one wait a batch), each chunk stored by 16-byte shared stores where its place in dst is 16-byte aligned (the
// packed units' kernels_staged is, after their spread planes; a lane a chunk, so element stores would take C-way bank
// conflicts: L1 9.3 -> 11.2 us on dw-1152-7k5 fp16), else element by element; the elements before the boundary and
// after the last whole chunk (under C each) take a lane each.  Element loads took ~136 instructions a warp for a
// 32-channel unit's 800 float16 weights (dw-1152-7k5).
template <int B, typename T>
__device__ __forceinline__ void stage_weight_chunks(acc_t<T>* dst, const T* __restrict__ run, int count) {
  typedef acc_t<T> A;
  constexpr int C = 16 / sizeof(T), CA = 16 / sizeof(A);  // elements a 16-byte global load, shared store
  const int head = run_head(run, count);
  const int chunks = (count - head) / C, tail0 = head + chunks * C;
  const int t = (int)threadIdx.x;
  if (t < head + count - tail0) {
    const int e = t < head ? t : tail0 + t - head;
    dst[e] = to_acc(run[e]);
  }
  const bool wide = (reinterpret_cast<unsigned long long>(dst + head) & 15) == 0;
  const Pack<T, C>* src = reinterpret_cast<const Pack<T, C>*>(run + head);
  for (int c = t; c < chunks; c += B * (int)blockDim.x) {
    Pack<T, C> v[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (c + b * (int)blockDim.x < chunks) v[b] = src[c + b * (int)blockDim.x];
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (c + b * (int)blockDim.x < chunks) {
        A* out = dst + head + (c + b * (int)blockDim.x) * C;
        if (wide) {
#pragma unroll
          for (int h = 0; h < C; h += CA) {
            Pack<A, CA> packed;
#pragma unroll
            for (int k = 0; k < CA; ++k) packed.v[k] = to_acc(v[b].v[h + k]);
            *reinterpret_cast<Pack<A, CA>*>(out + h) = packed;
          }
        } else {
#pragma unroll
          for (int k = 0; k < C; ++k) out[k] = to_acc(v[b].v[k]);
        }
      }
    }
  }
}

// tile[0, count) = 0 by the whole block, 16 bytes a store (count: a multiple of 16 bytes' elements).
template <typename A>
__device__ __forceinline__ void zero_tiles(A* tile, int count) {
  constexpr int C = 16 / sizeof(A);
  Pack<A, C> zeros;
#pragma unroll
  for (int e = 0; e < C; ++e) zeros.v[e] = A(0);
  for (int e = (int)threadIdx.x * C; e < count; e += (int)blockDim.x * C)
    *reinterpret_cast<Pack<A, C>*>(tile + e) = zeros;
}

// A 16-bit value from its bits (the low 16 of u).
template <typename T> __device__ __forceinline__ T half_bits(unsigned u);
template <> __device__ __forceinline__ __half half_bits<__half>(unsigned u) {
  return __ushort_as_half((unsigned short)u);
}
template <> __device__ __forceinline__ __nv_bfloat16 half_bits<__nv_bfloat16>(unsigned u) {
  return __ushort_as_bfloat16((unsigned short)u);
}

// RAW16: 16-bit 3x3 rows of whole 8-byte slots staged as they are in memory, 16-bit, by 8-byte cp.async copies
// straight to shared memory (sm_80 and newer): no register, no conversion, no wait a chunk; the unit waits once for its
// copies.  The weight gradient at stride 1 and 2 (depthwise_bwd_weight's instantiations for __half and __nv_bfloat16:
// AlignedStaging's chunks cost a warp ~42 instructions each, two 8-byte loads each waited before its store, the
// run-time shift's selects, 4 conversions, and 18 of its 22 waits a warp, PREDICTED dw-256-56 fp16) and the stride-1
// forward and input gradient (depthwise_persistent's rows16, copied by stage_rows16).  A staged row starts at the slot
// that holds column x0 = ox0 - pad_left, so its data sit `shift` = x0 mod 4 halves in (the same for every tile:
// tile_w is a multiple of FWD_COLUMNS); the items read their halves from there (load_raw_row) and convert each where
// it sits.  Planes `plane` halves apart, spread over the banks as AlignedStaging's SPREAD (in halves).  Where the raw
// tiles would not fit in the float tiles' space (the planner sizes those), on unaligned rows, and before sm_80, the
// kernels stage with AlignedStaging.  The same products in the same order: the same bits.
template <typename T, typename I, bool SPREAD> struct RawStaging {
  static constexpr int SLOT = 4, BANK_ROW = 64;  // halves per copy, per row of the 32 four-byte banks
  int shift, pitch, plane, slots, lanes, slot0, in_h, q0, r0, pass_q, pass_r;
  bool stager;
  __device__ __forceinline__ RawStaging(int pad_left, int in_h_, int in_w, int span) : in_h(in_h_) {
    shift = -pad_left & (SLOT - 1);
    pitch = (shift + in_w + SLOT - 1) / SLOT * SLOT;
    plane = in_h * pitch;
    if (SPREAD) plane += (span - plane) & (BANK_ROW - 1);
    slots = pitch / SLOT;
    lanes = min(slots, (int)blockDim.x);
    const int rows_per_pass = (int)blockDim.x / lanes;
    stager = (int)threadIdx.x < rows_per_pass * lanes;
    slot0 = (int)threadIdx.x % lanes;
    q0 = (int)threadIdx.x / lanes / in_h, r0 = (int)threadIdx.x / lanes % in_h;
    pass_q = rows_per_pass / in_h, pass_r = rows_per_pass % in_h;
  }

  // Where row r of staged plane q starts in the tile (halves).
  __device__ __forceinline__ int offset(int q, int r) const { return q * plane + r * pitch; }

  // Copy `planes` tiles of rows [y0, y0 + in_h), the slots from column x0 - shift, of the planes plane_of(q) points at
  // (nullptr: none); slots outside the plane are zero-filled (src-size 0, nothing read).  The caller commits and waits.
  template <typename PlaneOf>
  __device__ __forceinline__ void stage(T* tile, int planes, int y0, int x0, int height, int width, const T* any,
                                        PlaneOf plane_of) const {
    if (!stager) return;
    const int first = x0 - shift;  // a multiple of SLOT
    for (int q = q0, r = r0; q < planes;) {
      const int yy = y0 + r;
      const T* row = yy >= 0 && yy < height ? plane_of(q) : nullptr;
      T* dst = tile + offset(q, r);
      for (int k = slot0; k < slots; k += lanes) {
        const int col = first + k * SLOT;
        const bool inside = row != nullptr && col >= 0 && col < width;
        cp_async_ca_8(dst + k * SLOT, inside ? row + yy * (I)width + col : any, inside ? 8 : 0);
      }
      q += pass_q, r += pass_r;
      if (r >= in_h) r -= in_h, ++q;
    }
  }
};

// row[0..L) = the halves shift .. shift + L - 1 from src (4-byte aligned) as acc_t: 4-byte shared loads from the
// half pair that holds half `shift`, an odd shift's halves funnelled by byte permutes (its selector `odd` = 0x5432, an
// even one's 0x3210: the same code for every shift, so the products are compiled once), each half converted from
// where it sits in its register.
template <typename T, typename A, int L>
__device__ __forceinline__ void load_raw_row(const T* src, int shift, unsigned odd, A (&row)[L]) {
  constexpr int WORDS = L / 2 + 1;  // the pairs that hold L halves from an odd one
  const unsigned* at = reinterpret_cast<const unsigned*>(src + (shift & ~1));
  unsigned w[WORDS];
#pragma unroll
  for (int k = 0; k < WORDS; ++k) w[k] = at[k];
#pragma unroll
  for (int k = 0; k < (L + 1) / 2; ++k) {
    const unsigned pair = __byte_perm(w[k], w[k + 1 < WORDS ? k + 1 : k], odd);  // odd L: the last half alone
    row[2 * k] = to_acc(half_bits<T>(pair));
    if (2 * k + 1 < L) row[2 * k + 1] = to_acc(half_bits<T>(pair >> 16));
  }
}

// q = j * d + t (q >= 0, d > 0) by subtraction: for the small q of stage_rows16 (a thread's first staged plane of a
// unit and the planes of a pass: under 256 / in_h), where a division by the input gradient's run-time multiplier
// cost ~25 instructions a unit (kept once per block instead, its 4 registers took the kernel to 72: 3 blocks an SM).
// d = 1 (a multiplier of 1) skips the loop.  The forward (terms = 1 at compile time) does not call it: with it, even
// folded away, its SASS grew (NVRTC 13: 56 -> 60 registers, +74 instructions a warp on dw-256-56 fp16).
__device__ __forceinline__ void small_divmod(int q, int d, int& j, int& t) {
  j = d == 1 ? q : 0, t = d == 1 ? 0 : q;
  while (t >= d) t -= d, ++j;
}

// RawStaging::stage for the 3x3 stride-1 per-image forward and input gradient, where a thread copies one slot of each
// of its rows (lanes == slots).  Staged plane q = j * terms + t is src plane run + (j * stride + t) planes (none from
// j = valid on: zeros), as depthwise_persistent maps them.  The slot's column and whether it is inside the plane are
// the same on every row of the thread, so they are worked out once; the row's plane and src offset are stepped with
// the staging's pass (plane_of divides q by terms a row: ~20 instructions in the input gradient), a row's carry into
// the next plane (and t's into the next j) included, so that a row costs no division and no 64-bit product: a copy
// and its steps.  ONE_TERM (the forward: terms = 1 at compile time): j = q and t = 0, so only q, r and the offset are
// stepped.  Rows that are not whole aligned slots (`aligned` false: a width that is not a multiple of 4, an unaligned
// base) take the same slots element by element, each of the 4 loaded where it is inside the plane, into the same raw
// layout (one 8-byte shared store), so that the items read one layout.  (By AlignedStaging's float chunks, each cut
// from two waited 8-byte loads by x0 mod 4 and converted, a row cost ~40 instructions: ~1,290 of the forward's 4,471
// a warp, PREDICTED dw-256-56 fp16.)
template <bool ONE_TERM, typename T, typename I, bool SPREAD>
__device__ __forceinline__ void stage_rows16(const RawStaging<T, I, SPREAD>& st, T* tile, int planes, int y0, int x0,
                                             int height, int width, const T* run, int terms, int stride, int valid,
                                             I src_plane, bool aligned) {
  if (!st.stager) return;
  const int slot = x0 - st.shift + st.slot0 * st.SLOT;
  const bool slot_in = slot >= 0 && slot < width;
  int pass_j = st.pass_q, pass_t = 0, j = st.q0, t = 0;  // ONE_TERM: q = j
  if constexpr (!ONE_TERM) {
    small_divmod(st.pass_q, terms, pass_j, pass_t);
    small_divmod(st.q0, terms, j, t);
  }
  const I src_step = ((I)pass_j * stride + pass_t) * src_plane + (I)st.pass_r * width;
  const I src_carry = src_plane - (I)st.in_h * width, src_wrap = (I)(stride - terms) * src_plane;
  int q = st.q0, r = st.r0;
  I at_src = ((I)j * stride + t) * src_plane + (I)(y0 + r) * width + slot;  // column slot of the row (run + at_src)
  T* const dst = tile + st.slot0 * st.SLOT;
  while (q < planes) {
    const int yy = y0 + r;
    const bool row_in = yy >= 0 && yy < height && (ONE_TERM ? q : j) < valid;
    if (aligned) {
      const bool load = slot_in && row_in;
      cp_async_ca_8(dst + st.offset(q, r), load ? run + at_src : run, load ? 8 : 0);  // else zeros, nothing read
    } else {
      Pack<T, 4> v;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v.v[e] = from_acc<T>(0.0f);
        if (row_in && slot + e >= 0 && slot + e < width) v.v[e] = run[at_src + e];
      }
      *reinterpret_cast<Pack<T, 4>*>(dst + st.offset(q, r)) = v;
    }
    if constexpr (ONE_TERM) {  // j = q, t = 0: a row's carry into the next plane is one into the next j too
      q += st.pass_q, r += st.pass_r, at_src += src_step;
      if (r >= st.in_h) r -= st.in_h, ++q, at_src += src_carry + src_wrap;
    } else {
      q += st.pass_q, r += st.pass_r, j += pass_j, t += pass_t, at_src += src_step;
      if (r >= st.in_h) r -= st.in_h, ++q, ++t, at_src += src_carry;
      if (t >= terms) t -= terms, ++j, at_src += src_wrap;
    }
  }
}

// Forward (TRANSPOSED false) and stride-1 input gradient (TRANSPOSED true, S = 1) of a K x K kernel: the
// persistent tiled convolution from `src` planes to `dst` planes, as depthwise_tiled describes them: forward,
// src = x (C channels), dst = y (C * m), a unit is one output channel d = c * m + k; input gradient, src =
// grad_out (C * m), dst = grad_x (C), a unit is one input channel c, whose m grad_out tiles are staged together
// and convolved with the flipped kernels.
//
// Small planes (PACK: the kernels' template parameter, planned when one tile covers the whole output plane): a unit is
// instead the per_block consecutive dst channels d0 .. d0 + per_block - 1 of ONE image (the last group of an image
// may be partial; the forward packs only at multiplier 1, where dst channel = src channel), item p computing
// channel d0 + p.  Their src planes and dst planes are then each one contiguous run of memory, and the outputs go
// through shared memory (over the staged tiles, after a barrier) to be written as one contiguous run, 16 bytes a
// lane where it is aligned, instead of the scattered V x U items (a 7-wide row: under 10% of each store's sectors
// used).  Launch contract for PACK: tiles_x == tiles_y == 1.
// FLAT (every PACK instantiation; from 5x5 on (SPREAD) only where the rows are not whole 16-byte chunks: 7x7 and
// 14x14 planes, not 28x28 ones, which stage by rows with vector loads; the 16-bit 5x5 where the planes fit in the
// tiles, by 16-byte chunks: `chunked`) stages the src run flat instead of by rows:
// lane e mod 32 reads element e (RunWalk), so a warp reads 32 consecutive elements, whole sectors and no lane on the
// halo (by rows, 18 lanes a row of which 14 read: 14x14 float16 planes used 59% of the bytes of their sectors), into
// tiles zeroed just before with 16-byte stores.  A thread issues the loads of `batch` elements before it stores any
// (8 from 5x5 on, 2 for 3x3: more costs the 3x3 kernels registers, hence occupancy), so it waits on global memory
// once a batch: by rows, a 5x5 packed unit of 32 7x7 planes on 64 threads waited once per staged row, ~75 times a
// thread (benchmarks.predict's executed count: 73 waits a warp, the latency that bound those cases; now 21).  FLAT
// without SPREAD also writes the staged outputs a pair at a time where dst_w is even (see there).
template <typename T, typename I, int K, int S, bool TRANSPOSED, bool PACK, bool SPREAD>
__device__ __forceinline__ void depthwise_persistent(
    const T* __restrict__ src, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ dst,
    I images, int channels, int multiplier, int src_h, int src_w, int dst_h, int dst_w, int pad_top, int pad_left,
    int tile_h, int tile_w, int tiles_x, int tiles_y, int per_block, int has_bias) {
  constexpr bool pack_channels = PACK;
  typedef acc_t<T> A;
  constexpr int V = StripRows<K>::value, U = FWD_COLUMNS, L = (U - 1) * S + K;  // L: a row's columns an item reads
  const int terms = TRANSPOSED ? multiplier : 1;    // staged planes (and kernels) per image and output plane
  const int kernels = TRANSPOSED ? 1 : multiplier;  // output planes per input channel
  const int in_h = (tile_h - 1) * S + K, in_w = (tile_w - 1) * S + K;
  // SPREAD: AlignedStaging<true>, ItemLayout<true> (see the kernels' SPREAD); the packed ones also stage weights.
  constexpr bool spread = SPREAD, stage_weights = PACK && SPREAD;
  // direct: the per-image stride-2 forward reads its rows from global memory, no staging (direct_fma; the planner's
  // _forward_staging gives it no shared memory); fast: its paddings and rows that direct_row's FAST loads take
  constexpr bool direct = S == 2 && !PACK && !SPREAD && !TRANSPOSED;
  const bool fast = direct && pad_left == (K - 1) / 2 && src_w % (16 / sizeof(T)) == 0 &&
                    reinterpret_cast<unsigned long long>(src) % 16 == 0;
  const AlignedStaging<T, I, spread> staging(src, src_w, in_h, in_w, tile_w * S);
  const int pitch = staging.pitch;
  A* tile = reinterpret_cast<A*>(depthwise_smem);
  const int dst_channels = channels * kernels, src_channels = channels * terms;
  const I src_plane = (I)src_h * src_w, dst_plane = (I)dst_h * dst_w;
  // FLAT's walk over the src run; the only tile is at (0, 0), so src row y is staged row y + pad_top.  flat_run:
  // this launch stages flat (SPREAD's aligned rows stage by rows).  batch: loads issued before their stores.
  constexpr bool flat = PACK;
  // chunked: the packed forward (3x3, 5x5), the packed float32 5x5 input gradient and the 16-bit 5x5 SPREAD input
  // gradient run flat by 16-byte chunks (stage_chunks) where every plane element lands inside the tiles, the 16-bit 5x5
  // also where the rows are whole chunks (28x28: by rows, two waited 8-byte loads a chunk, 14.2 -> 2.0 waits a warp on
  // dw-240-28k5 fp16; float32's whole-chunk rows stay by rows, whose 16-byte shared stores take a quarter of the
  // chunks' wavefronts); their runs of planes cut by the staged rows or columns walk by elements (stage_run), the walk
  // set up each unit.  By elements (stage_run) the packed forward's walk took ~27 instructions an element, a third of a
  // warp's (PREDICTED, RESULTS.md "dwsmall": dw-480-14k5 fp32 4065 -> 2962 instructions a warp; dw-480-14 3x3 1267 ->
  // 682, for 56 -> 80 registers, 32 -> 24 warps an SM); the packed 3x3 input gradient too (task dw5: dw-480-14 fp16
  // 1,238 -> 642 a warp, 7.1 -> 1.0 waits, 64 -> 95 registers, 4 -> 2 blocks of 256 an SM).  Not the 7x7 (128 ->
  // 148-165 registers, 8 -> 6 blocks of 64 an SM, input gradient; no benchmark case).  The float32 5x5 input gradient
  // took 126 -> 147 registers by chunks: its packed instantiations are held to 128 (depthwise_bwd_input's
  // specialisations; task dwk5: 6.0-8.9 -> 0 waits a warp, dw-672-14k5 5,753 -> 4,272 instructions a warp, PREDICTED).
  // Not float64 (204 registers already).
  constexpr bool chunks =
      PACK && (K == 3 || K == 5 && (!TRANSPOSED || sizeof(T) == 4)) || SPREAD && K == 5 && sizeof(T) == 2;
  const bool chunked = chunks && (!SPREAD || sizeof(T) == 2 || !staging.rows_aligned) && pad_top >= 0 &&
                       pad_left >= 0 && pad_top + src_h <= in_h && pad_left + src_w <= in_w;
  const RunWalk walk = flat && !chunks ? RunWalk(src_w, src_h, pitch, staging.plane, pad_top, pad_left) : RunWalk();
  const bool flat_run = flat && (!SPREAD || !staging.rows_aligned || chunked);
  constexpr int batch = SPREAD ? STAGE_BATCH : 2;
  // rows16: the 16-bit 3x3 stride-1 per-image units (sm_80 and newer) stage their rows raw (RAW16: stage_rows16,
  // load_raw_row), in the float tiles' space the planner sizes: its tiles are at most TILE_MAX = 32 columns wide, a
  // multiple of FWD_COLUMNS (so x0 mod 4 = -pad_left mod 4, and a row's slots, at most 9, fit any block), and there
  // a raw plane takes less than a float plane's bytes, with a word to spare (an item's last row read at shift 2 takes
  // a word past its row, unused).  Only its products are compiled in: one copy of them a kernel (with the float
  // rows' copy beside it, NVRTC 13 took the forward from 59 to 48 registers, sinking the weights' loads past the
  // barrier: 13 waits a warp, not 6.5).
  constexpr bool rows16 = sizeof(T) == 2 && K == 3 && S == 1 && !PACK && CUPYCONV_HAS_CP_ASYNC;
  const RawStaging<T, I, spread> raw(pad_left, in_h, in_w, tile_w * S);
  T* const raw_tile = reinterpret_cast<T*>(depthwise_smem);

  // Once per block: this thread's output item (columns ox_l..ox_l + U - 1 of strip s of plane p of the unit) ...
  const ItemLayout<spread> item(tile_w, tile_h, U, V, per_block);
  const int ox_l = item.ox_l, s = item.s, p = item.p;
  const bool out_aligned = dst_w % U == 0 && (reinterpret_cast<unsigned long long>(dst) % (U * sizeof(T))) == 0;
  // ... and the digits of the first unit and of the step: (tile column, tile row, kernel of the channel, channel,
  // image group), or with pack_channels (1, 1, 1, channel group, image): PACK's tiles_x and tiles_y are 1 by the
  // launch contract, radixes known at compile time whose divisions vanish (~55 instructions a warp, dw-1152-7k5).
  // Not the packed 3x3 forward: it then took 64 registers, not 80, and its 4 blocks of 256 an SM made 3.64 waves of
  // 2,048, whose partial last wave cost it more than the 16 instructions a warp it saved (PREDICTED dw-480-14 fp32
  // 13.30 -> 14.09 us at the low end; RESULTS.md "dwk5").
  constexpr bool fixed_tiles = pack_channels && (K != 3 || TRANSPOSED);
  const int radix_x = fixed_tiles ? 1 : tiles_x, radix_y = fixed_tiles ? 1 : tiles_y;
  const int radix_k = pack_channels ? 1 : kernels;
  const int radix_c = pack_channels ? (dst_channels + per_block - 1) / per_block : channels;
  int tx, ty, k, c, step_tx, step_ty, step_k, step_c;
  I g, step_g;
  {
    int u = (int)blockIdx.x, v = (int)gridDim.x;
    tx = u % radix_x, u /= radix_x, step_tx = v % radix_x, v /= radix_x;
    ty = u % radix_y, u /= radix_y, step_ty = v % radix_y, v /= radix_y;
    k = u % radix_k, u /= radix_k, step_k = v % radix_k, v /= radix_k;
    c = u % radix_c, u /= radix_c, step_c = v % radix_c, v /= radix_c;
    g = u, step_g = v;
  }
  const I groups = pack_channels ? images : (images + per_block - 1) / per_block;

  while (g < groups) {
    // The unit's first dst channel and image, and this thread's: plane p is (image0 + p, d) or (image0, d0 + p).
    const int d0 = pack_channels ? c * per_block : c * kernels + k;
    const I image0 = pack_channels ? g : g * per_block;
    const int d = pack_channels ? min(d0 + p, dst_channels - 1) : d0;  // clamped: a partial group's idle items
    const I n = pack_channels ? image0 : image0 + p;
    const int oy0 = ty * tile_h, ox0 = tx * tile_w;
    // Staged plane q = j * terms + t (item j, term t) is src plane base + j * stride + t: packed, src channel
    // first + q of image0 (the forward packs only at multiplier 1: src channel = dst channel); else channel
    // first + t of image image0 + j.  Items from `valid` on are past the batch or the channels: zeros.
    const int first = (pack_channels ? d0 : c) * terms;
    const I base = image0 * src_channels + first;
    const int stride = pack_channels ? terms : src_channels;
    const int valid = pack_channels ? min(per_block, dst_channels - d0) : (int)min((I)per_block, images - image0);
    if (flat_run) {
      // Zeros everywhere (the halo; the planes of the items from `valid` on), then the run's elements that fall
      // inside the tiles (a large padding may leave rows or columns of the plane outside them).
      zero_tiles(tile, per_block * terms * staging.plane);  // in_h * pitch is a multiple of 16 bytes
      __syncthreads();
      const T* run = src + base * src_plane;
      if (chunked) {
        stage_chunks<ChunkBatch<T>::value, T>(tile, run, valid * terms * (int)src_plane, src_w, src_h, pitch,
                                              staging.plane, pad_top, pad_left);
      } else {
        stage_run<batch, T>(tile, chunks ? RunWalk(src_w, src_h, pitch, staging.plane, pad_top, pad_left) : walk,
                            valid * terms * (int)src_plane, src_w, src_h, pitch, staging.plane, pad_top, pad_left, in_h,
                            in_w, [&](int e, const RunWalk&) { return run[e]; });
      }
    } else if (!direct) {
      const int y_0 = oy0 * S - pad_top, x_0 = ox0 * S - pad_left;
      if constexpr (rows16) {
        stage_rows16<!TRANSPOSED>(raw, raw_tile, per_block * terms, y_0, x_0, src_h, src_w, src + base * src_plane,
                                  terms, stride, valid, src_plane, staging.rows_aligned);
        cp_async_commit();
      } else {
        staging.stage(tile, per_block * terms, y_0, x_0, src_h, src_w, [&](int q) -> const T* {
          const int j = q / terms;
          return j < valid ? src + (base + (I)j * stride + q % terms) * src_plane : nullptr;
        });
      }
    }
    // The item's (first) weights, issued before the barrier so that they arrive during it (cached: the threads of
    // a plane and its other units read the same K x K).  Keeping them across units while the channel holds
    // saves 3-5% of the forward loop's instructions and costs 8-32 registers (NVRTC 13, sm_90): reloaded.
    // PACK with spread planes: the items of a warp are up to 8 channels, so each of their K * K loads would touch up
    // to 8 lines; the unit's kernels (channels d0 .. d0 + valid - 1, `terms` each: one contiguous run) are staged
    // after the tiles instead, coalesced, and each item reads its own from there (an odd K * K apart: different
    // banks).  (3x3 packs 2 channels a warp: its loads from global memory cost fewer instructions.)
    const int kernel0 = TRANSPOSED ? d * terms : d;
    A w[K][K];
    A* const kernels_staged = tile + per_block * terms * staging.plane;  // stage_weights only (the planner's _packed)
    if constexpr (stage_weights) {
      // The 5x5: 16-byte chunks, two loads a thread before their stores (stage_weight_chunks; a weight at a time
      // waited for each: dw-1152-7k5 fp16, 32 channels' 800 weights on 64 threads, 15.6 of its 20.7 waits a warp;
      // batches of 8 element loads then took ~136 instructions a warp a unit).  The 7x7: a weight at a time (batches
      // of 8 took its float16 input gradient from 128 to 162 registers).
      const T* run = weight + (I)d0 * terms * (K * K);
      const int count = valid * terms * (K * K);
      if constexpr (K == 5) {
        stage_weight_chunks<WEIGHT_CHUNK_BATCH, T>(kernels_staged, run, count);
      } else {
        for (int e = (int)threadIdx.x; e < count; e += (int)blockDim.x) kernels_staged[e] = to_acc(run[e]);
      }
    } else {
      load_kernel<K, TRANSPOSED>(weight + (I)kernel0 * (K * K), w);
    }
    if constexpr (rows16) cp_async_wait<0>();
    if (!direct) __syncthreads();

    const int ox = ox0 + ox_l, oy = oy0 + s * V;
    const bool active = item.valid && (pack_channels ? d0 + p < dst_channels : n < images) && ox < dst_w;
    A acc[V][U];
    if (active || direct) {  // direct: every lane (direct_fma's shuffles)
      const A init = !TRANSPOSED && has_bias ? to_acc(bias[d]) : A(0);
#pragma unroll
      for (int v = 0; v < V; ++v) {
#pragma unroll
        for (int u = 0; u < U; ++u) acc[v][u] = init;
      }
      for (int t = 0; t < terms; ++t) {  // the forward: once
        if (stage_weights) load_kernel<K, TRANSPOSED>(kernels_staged + (p * terms + t) * (K * K), w);
        else if (t > 0) load_kernel<K, TRANSPOSED>(weight + ((I)kernel0 + t) * (K * K), w);
        if constexpr (direct) {
          // an item past dst_w loads too (its columns are its left neighbour's halo); the forward: terms = 1
          const T* plane = item.valid && n < images ? src + (base + (I)p * stride) * src_plane : nullptr;
          const int lane = (int)threadIdx.x % 32, iy0 = oy * S - pad_top, ix0 = ox * S - pad_left;
          const bool left = lane > 0 && ox_l > 0, right = lane < 31 && ox_l + U < tile_w;
          if (fast) direct_fma<true, T, I, K, V, U>(plane, src_h, src_w, iy0, ix0, left, right, w, acc);
          else direct_fma<false, T, I, K, V, U>(plane, src_h, src_w, iy0, ix0, left, right, w, acc);
        } else if constexpr (rows16) {
          const T* at = raw_tile + raw.offset(p * terms + t, s * V) + ox_l;
          const unsigned odd = raw.shift & 1 ? 0x5432u : 0x3210u;
          block_fma<A, K, S, V, U>(w, acc,
                                   [&](int r, A(&row)[L]) { load_raw_row(at + r * raw.pitch, raw.shift, odd, row); });
        } else {
          const A* at = tile + staging.offset(p * terms + t, s * V * S) + ox_l * S;
          block_fma<A, K, S, V, U>(w, acc, [&](int r, A(&row)[L]) { load_row<A, L>(at + r * pitch, row); });
        }
      }
      // Per-image units: the item's outputs straight to dst, inside this block (the same store after the block,
      // under the same test, cost up to 28 more registers: NVRTC 13, sm_90).
      if (!PACK && (!direct || active)) {
        T* out = dst + ((n * dst_channels + d) * dst_h + oy) * (I)dst_w + ox;
        const bool whole = out_aligned && ox + U <= dst_w;
#pragma unroll
        for (int v = 0; v < V; ++v, out += dst_w) {
          if (oy + v >= dst_h) break;
          if (whole) {
            Pack<T, U> packed;
#pragma unroll
            for (int u = 0; u < U; ++u) packed.v[u] = from_acc<T>(acc[v][u]);
            *reinterpret_cast<Pack<T, U>*>(out) = packed;
          } else {
#pragma unroll
            for (int u = 0; u < U; ++u) {
              if (ox + u < dst_w) out[u] = from_acc<T>(acc[v][u]);
            }
          }
        }
      }
    }
    if constexpr (PACK) {
      // The unit's planes, [plane][y][x] as in dst, over the staged tiles, then copied out as one run.  FLAT, where
      // dst_w is even: every pair of an item's outputs starts on an even word (planes, rows and ox all even), so one
      // 8-byte store a pair, half the stores; a half warp's pairs (4 columns of items x 4 strips of one plane on
      // 14x14 planes) take 2 wavefronts where its single stores took 4 (items 4 words apart, strips 56 = 24 modulo
      // 32: 8 distinct banks for 16 lanes).  (SPREAD's planes-first items gain less from pairs than their extra
      // code costs.)
      static_assert(U % 2 == 0, "the output pairs need an even FWD_COLUMNS");
      __syncthreads();
      A* staged_out = tile + p * dst_plane + (I)oy * dst_w + ox;
      const bool pairs = flat && !SPREAD && dst_w % 2 == 0;
      if (active) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          if (oy + v < dst_h) {
#pragma unroll
            for (int u = 0; u < U; u += 2) {
              A* out = staged_out + v * dst_w + u;
              if (pairs && ox + u < dst_w) {  // then ox + u + 1 < dst_w too
                Pack<A, 2> pair;
                pair.v[0] = acc[v][u], pair.v[1] = acc[v][u + 1];
                *reinterpret_cast<Pack<A, 2>*>(out) = pair;
              } else if (!pairs) {
                if (ox + u < dst_w) out[0] = acc[v][u];
                if (ox + u + 1 < dst_w) out[1] = acc[v][u + 1];
              }
            }
          }
        }
      }
      __syncthreads();
      store_run<T, I>(dst + (image0 * dst_channels + d0) * dst_plane, tile, valid * (int)dst_plane);
    }
    if (!direct) __syncthreads();  // the next unit overwrites the tile

    int carry = 0;
    next_digit(tx, step_tx, radix_x, carry);
    next_digit(ty, step_ty, radix_y, carry);
    next_digit(k, step_k, radix_k, carry);
    next_digit(c, step_c, radix_c, carry);
    g += step_g + carry;
  }
}

// PACK (the planner's Tiling.pack_channels, small planes): its own instantiation, so that each kernel holds only
// its unit kind's code and registers (large planes never pack and keep the per-image path's registers).
// SPREAD (the planner's _spread_planes): thread items planes first and staged planes spread over the banks
// (AlignedStaging): the packed instantiations from SPREAD_MIN_K on, and the per-image ones whose row of thread items
// spans less than a bank row (28-wide tiles of 56x56 and 112x112 planes: 7 items of 16 bytes, the next strip of
// the same plane on the same banks), which name it.
template <typename T, typename I, int K, int S, bool PACK = false, bool SPREAD = PACK && K >= SPREAD_MIN_K>
__global__ void depthwise_fwd(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                              T* __restrict__ y, I images, int channels, int multiplier, int height, int width,
                              int out_h, int out_w, int pad_top, int pad_left, int tile_h, int tile_w,
                              int tiles_x, int tiles_y, int per_block, int has_bias) {
  depthwise_persistent<T, I, K, S, false, PACK, SPREAD>(x, weight, bias, y, images, channels, multiplier, height,
                                                        width, out_h, out_w, pad_top, pad_left, tile_h, tile_w,
                                                        tiles_x, tiles_y, per_block, has_bias);
}

// Forward, any geometry whose tile fits in shared memory.
template <typename T, typename I>
__global__ void depthwise_fwd_generic(const T* __restrict__ x, const T* __restrict__ weight,
                                      const T* __restrict__ bias, T* __restrict__ y, I images, int channels,
                                      int multiplier, int height, int width, int out_h, int out_w, int kernel_h,
                                      int kernel_w, int stride_h, int stride_w, int dilation_h, int dilation_w,
                                      int pad_top, int pad_left, int tile_h, int tile_w, int tiles_x,
                                      int tiles_y, int per_block, int has_bias) {
  depthwise_tiled<T, I, false>(x, weight, bias, y, images, channels, multiplier, height, width, out_h,
                                     out_w, kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w,
                                     pad_top, pad_left, tile_h, tile_w, tiles_x, tiles_y, per_block, has_bias);
}

// Forward of tiny planes (depthwise_planes), any geometry whose unit fits in shared memory; K > 0: a K x K window
// at stride 1 (depthwise_planes says what it requires; its launch bounds: above depthwise_planes).
template <typename T, typename I, int K = 0>
__global__ void __launch_bounds__(256, planes_min_blocks<I, K>)
    depthwise_fwd_planes(const T* __restrict__ x, const T* __restrict__ weight,
                         const T* __restrict__ bias, T* __restrict__ y, I images, int channels,
                         int multiplier, int height, int width, int out_h, int out_w, int kernel_h,
                         int kernel_w, int stride_h, int stride_w, int dilation_h, int dilation_w,
                         int pad_top, int pad_left, int has_bias) {
  depthwise_planes<T, I, false, K>(x, weight, bias, y, images, channels, multiplier, height, width, out_h, out_w,
                                   kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left,
                                   has_bias);
}

// Input gradient at stride 1, K x K kernel (K = 3, 5, 7), dilation 1: the persistent tiled convolution of
// grad_out with the flipped kernels (grid: FORWARD_BLOCKS).  pad_top/pad_left: the forward's.  (No launch bounds: by
// chunks the packed 3x3 took 95 registers, 2 blocks of 256 an SM; __launch_bounds__(256, 3) held it at 79, but any
// bound on this template also moved the 5x5 instantiations' registers: PREDICTED dw-480-14k5 fp32 input gradient
// 19.9-64.3 -> 30.6-88.8 us, RESULTS.md "dw5".)
template <typename T, typename I, int K, bool PACK = false,
          bool SPREAD = PACK && K >= SPREAD_MIN_K>  // PACK, SPREAD: as in depthwise_fwd
__global__ void depthwise_bwd_input(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                    T* __restrict__ grad_x, I images, int channels, int multiplier, int height,
                                    int width, int out_h, int out_w, int pad_top, int pad_left, int tile_h,
                                    int tile_w, int tiles_x, int tiles_y, int per_block) {
  const int top = K - 1 - pad_top, left = K - 1 - pad_left;  // the padding of the equivalent correlation
  depthwise_persistent<T, I, K, 1, true, PACK, SPREAD>(grad_out, weight, weight, grad_x, images, channels,
                                                       multiplier, out_h, out_w, height, width, top, left, tile_h,
                                                       tile_w, tiles_x, tiles_y, per_block, 0);
}

// The packed 5x5 float32 input gradient stages by chunks (depthwise_persistent's `chunks`), which left free took it
// from 126 to 147-148 registers (6 blocks of 64 an SM, not 8); held to 128 here (__launch_bounds__(256, 2): no
// spills, NVRTC 13, sm_90), it waits on global memory 6-9 times a warp less (PREDICTED, RESULTS.md "dwk5").  Explicit
// specialisations, so that no other instantiation gets a bound (any bound moved the others' registers: the per-image
// float32 ones from 64-72 to 89-136).
#define DEPTHWISE_BWD_INPUT_HELD(I)                                                                                 \
  template <>                                                                                                       \
  __global__ void __launch_bounds__(256, 2) depthwise_bwd_input<float, I, 5, true, true>(                           \
      const float* __restrict__ grad_out, const float* __restrict__ weight, float* __restrict__ grad_x, I images,   \
      int channels, int multiplier, int height, int width, int out_h, int out_w, int pad_top, int pad_left,          \
      int tile_h, int tile_w, int tiles_x, int tiles_y, int per_block) {                                            \
    depthwise_persistent<float, I, 5, 1, true, true, true>(grad_out, weight, weight, grad_x, images, channels,       \
                                                           multiplier, out_h, out_w, height, width, 4 - pad_top,    \
                                                           4 - pad_left, tile_h, tile_w, tiles_x, tiles_y,          \
                                                           per_block, 0);                                          \
  }
DEPTHWISE_BWD_INPUT_HELD(int)
DEPTHWISE_BWD_INPUT_HELD(long long)
#undef DEPTHWISE_BWD_INPUT_HELD

// Input gradient at stride 1, any kernel size and dilation.  pad_top/pad_left: the forward's.
template <typename T, typename I>
__global__ void depthwise_bwd_input_generic(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                            T* __restrict__ grad_x, I images, int channels, int multiplier,
                                            int height, int width, int out_h, int out_w, int kernel_h,
                                            int kernel_w, int dilation_h, int dilation_w, int pad_top,
                                            int pad_left, int tile_h, int tile_w, int tiles_x, int tiles_y,
                                            int per_block) {
  depthwise_tiled<T, I, true>(grad_out, weight, weight, grad_x, images, channels, multiplier, out_h,
                                    out_w, height, width, kernel_h, kernel_w, 1, 1, dilation_h, dilation_w,
                                    (kernel_h - 1) * dilation_h - pad_top, (kernel_w - 1) * dilation_w - pad_left,
                                    tile_h, tile_w, tiles_x, tiles_y, per_block, 0);
}

// Large kernels at stride 1, dilation 1 (the planner's LARGE_MIN_K and up: RepLKNet's 31x31 on 14x14 planes), whole
// planes: the forward (TRANSPOSED false) and the stride-1 input gradient (TRANSPOSED true, the flipped kernels, the
// m grad_out planes of a channel), src -> dst as in depthwise_tiled.  The generic kernels run ~10 instructions a
// multiply-add there (a tap's weight, its window's shift, its loop), issue-bound at 2.4-5x the FMA floor.  Here a
// thread item is LARGE_ROWS (Q) x LARGE_COLUMNS (R) outputs of one dst plane, and it runs over the kernel rows and
// the R-column chunks of src that its window reaches rather than over single taps: per kernel row and chunk, the
// 2R - 1 weights that pair the chunk with the R output columns (broadcast 16-byte loads) are read once for the Q
// output rows, each of which reads its R src values (16-byte loads) for R * R FMAs, every index known at compile
// time.  Kernel rows are staged zero-padded by 2(R - 1) on each side (and src rows with zeros to a multiple of R),
// so that pairs outside the kernel or the plane add zeros and the chunk loop needs no bounds; a src row outside the
// plane is skipped (a branch the whole warp takes).  On 14x14 planes padded 15: 15 x 16 x 16 products per 2 x 16
// outputs where 14 x 14 each count, 71% of the FMAs, with 31 shared-memory wavefronts a warp per 128 FMAs.
// A unit is per_block images of one dst channel, thread items image fastest: a warp's lanes are images at one
// item, whose weights are one broadcast address; the staged planes are pitched to 16 bytes past a multiple of a
// 128-byte bank row (large_plane), so that the 8 lanes of a quarter warp read 8 different 16-byte bank groups.
// The planner's plan_large mirrors the shared memory.
template <typename A>
__device__ __forceinline__ int large_plane(int rows, int row_pitch) {  // elements between staged planes
  constexpr int C = 16 / sizeof(A), BANK_ROW = 128 / sizeof(A);
  const int size = rows * row_pitch;
  return size + ((C - size) % BANK_ROW + BANK_ROW) % BANK_ROW;
}

// One kernel row of depthwise_large (one grad_out row of depthwise_bwd_weight_lanes) against the item's Q src rows
// y0 .. y0 + Q - 1 (those inside the `rows` of the plane): over the chunks c of [c_lo, c_hi),
// acc[v][r] += w[c + R - 1 + e - r] * src[(y0 + v) * pitch + c + e], e < R.  w and every src row 16-byte aligned.
template <typename A, int Q, int R>
__device__ __forceinline__ void large_row(const A* w_row, const A* src, int y0, int rows, int pitch, int c_lo,
                                          int c_hi, A (&acc)[Q][R]) {
  for (int c = c_lo; c < c_hi; c += R) {
    A w[2 * R - 1];
    load_row<A, 2 * R - 1>(w_row + c, w);  // w[R - 1 + e - r]: src column c + e, output (or tap) column r
#pragma unroll
    for (int v = 0; v < Q; ++v) {
      if ((unsigned)(y0 + v) < (unsigned)rows) {
        A in[R];
        load_row<A, R>(src + (y0 + v) * pitch + c, in);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int e = 0; e < R; ++e) acc[v][r] += w[R - 1 + e - r] * in[e];
        }
      }
    }
  }
}

template <typename T, typename I, bool TRANSPOSED>
__device__ __forceinline__ void depthwise_large(
    const T* __restrict__ src, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ dst,
    I images, int channels, int multiplier, int src_h, int src_w, int dst_h, int dst_w, int kernel_h, int kernel_w,
    int pad_top, int pad_left, int per_block, int has_bias) {
  typedef acc_t<T> A;
  constexpr int Q = LARGE_ROWS, R = LARGE_COLUMNS, C = 16 / sizeof(A);
  static_assert(R % C == 0, "LARGE_COLUMNS must be whole 16-byte chunks of double");
  const int taps = kernel_h * kernel_w;
  const int terms = TRANSPOSED ? multiplier : 1;  // kernels (and staged planes per image) summed into one output
  const int row_pitch = (src_w + R - 1) / R * R;  // staged src rows: zeros from src_w on
  const int plane = large_plane<A>(src_h, row_pitch);
  // Weight (i, j) of a kernel at column j + w_off of its staged row: w_off leaves 2(R - 1) zeros before tap 0 and
  // makes the first weight an item reads (j = pad_left - (R - 1) - ox0 + a chunk's first column) 16-byte aligned.
  const int w_off = 2 * (R - 1) + ((-(R - 1 + pad_left)) % C + C) % C;
  const int w_pitch = (w_off + kernel_w + 2 * (R - 1) + C - 1) / C * C;
  A* xs = reinterpret_cast<A*>(depthwise_smem);
  A* ws = xs + per_block * terms * plane;
  const int src_channels = TRANSPOSED ? channels * multiplier : channels;
  const int dst_channels = TRANSPOSED ? channels : channels * multiplier;
  const int groups = (dst_w + R - 1) / R;  // items per Q dst rows
  const int items = per_block * ((dst_h + Q - 1) / Q) * groups;
  const I units = (images + per_block - 1) / per_block * dst_channels;
  // Staging: lanes along a staged row (coalesced), rows over the rest of the block, stepped without division.
  const int x_lanes = min(row_pitch, (int)blockDim.x), x_rows = (int)blockDim.x / x_lanes;
  const int w_lanes = min(w_pitch, (int)blockDim.x), w_rows = (int)blockDim.x / w_lanes;

  for (I unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int d = (int)(unit % dst_channels);  // the dst plane's channel
    const I image0 = unit / dst_channels * per_block;
    const int kernel0 = TRANSPOSED ? d * multiplier : d;  // its first kernel
    const int channel0 = TRANSPOSED ? kernel0 : d / multiplier;  // its first src channel
    if ((int)threadIdx.x < x_rows * x_lanes) {
      int q = 0, y = (int)threadIdx.x / x_lanes;  // staged plane q (image q / terms, term q % terms), row y
      while (y >= src_h) { y -= src_h; ++q; }
      while (q < per_block * terms) {
        const I image = image0 + q / terms;
        const T* row = image < images ?
            src + ((image * src_channels + channel0 + q % terms) * src_h + y) * (I)src_w : nullptr;
        A* to = xs + q * plane + y * row_pitch;
        for (int x = (int)threadIdx.x % x_lanes; x < row_pitch; x += x_lanes)
          to[x] = row != nullptr && x < src_w ? to_acc(row[x]) : A(0);
        y += x_rows;
        while (y >= src_h) { y -= src_h; ++q; }
      }
    }
    if ((int)threadIdx.x < w_rows * w_lanes) {
      int k = 0, i = (int)threadIdx.x / w_lanes;  // kernel k's row i
      while (i >= kernel_h) { i -= kernel_h; ++k; }
      while (k < terms) {
        const T* wk = weight + ((I)kernel0 + k) * taps;
        A* to = ws + (k * kernel_h + i) * w_pitch;
        for (int jj = (int)threadIdx.x % w_lanes; jj < w_pitch; jj += w_lanes) {
          const int j = jj - w_off;
          to[jj] = j >= 0 && j < kernel_w ?
              to_acc(wk[TRANSPOSED ? (kernel_h - 1 - i) * kernel_w + kernel_w - 1 - j : i * kernel_w + j]) : A(0);
        }
        i += w_rows;
        while (i >= kernel_h) { i -= kernel_h; ++k; }
      }
    }
    __syncthreads();

    for (int item = threadIdx.x; item < items; item += blockDim.x) {
      const int p = item % per_block, g = item / per_block % groups, oy0 = item / per_block / groups * Q;
      const I n = image0 + p;
      if (n >= images) continue;
      const int ox0 = g * R;
      A acc[Q][R];
      const A init = !TRANSPOSED && has_bias ? to_acc(bias[d]) : A(0);
#pragma unroll
      for (int v = 0; v < Q; ++v) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[v][r] = init;
      }
      // The kernel rows and src columns some output of the item reaches: output (oy, ox) reads src row
      // oy - pad_top + i and column ox - pad_left + j.
      const int i_lo = max(0, pad_top - oy0 - Q + 1), i_hi = min(kernel_h, pad_top - oy0 + src_h);
      const int x_lo = max(0, ox0 - pad_left), x_hi = min(src_w, ox0 + R - 1 - pad_left + kernel_w);
      const int c_lo = x_lo / R * R, c_hi = x_hi <= x_lo ? c_lo : x_hi;
      for (int k = 0; k < terms; ++k) {
        const A* xp = xs + (p * terms + k) * plane;
        // output column ox0 + r pairs src column x with weight column x - ox0 - r + pad_left
        const A* wk = ws + k * kernel_h * w_pitch + w_off + pad_left - (R - 1) - ox0;
        for (int i = i_lo; i < i_hi; ++i)  // src row oy0 - pad_top + i: output row oy0's
          large_row<A, Q, R>(wk + i * w_pitch, xp, oy0 - pad_top + i, src_h, row_pitch, c_lo, c_hi, acc);
      }
#pragma unroll
      for (int v = 0; v < Q; ++v) {
        if (oy0 + v < dst_h) {
          T* out = dst + ((n * dst_channels + d) * dst_h + oy0 + v) * (I)dst_w + ox0;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (ox0 + r < dst_w) out[r] = from_acc<T>(acc[v][r]);
          }
        }
      }
    }
    __syncthreads();  // the next unit overwrites the planes
  }
}

// Forward of a large kernel at stride 1, dilation 1, whole planes (depthwise_large).
template <typename T, typename I>
__global__ void depthwise_fwd_large(const T* __restrict__ x, const T* __restrict__ weight,
                                    const T* __restrict__ bias, T* __restrict__ y, I images, int channels,
                                    int multiplier, int height, int width, int out_h, int out_w, int kernel_h,
                                    int kernel_w, int pad_top, int pad_left, int per_block, int has_bias) {
  depthwise_large<T, I, false>(x, weight, bias, y, images, channels, multiplier, height, width, out_h, out_w,
                               kernel_h, kernel_w, pad_top, pad_left, per_block, has_bias);
}

// Input gradient of the same windows (depthwise_large over grad_out, the kernels flipped).  pad_top/pad_left: the
// forward's.
template <typename T, typename I>
__global__ void depthwise_bwd_input_large(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                          T* __restrict__ grad_x, I images, int channels, int multiplier, int height,
                                          int width, int out_h, int out_w, int kernel_h, int kernel_w, int pad_top,
                                          int pad_left, int per_block) {
  depthwise_large<T, I, true>(grad_out, weight, weight, grad_x, images, channels, multiplier, out_h, out_w, height,
                              width, kernel_h, kernel_w, kernel_h - 1 - pad_top, kernel_w - 1 - pad_left, per_block,
                              0);
}

// Input gradient of tiny planes at stride 1 (depthwise_planes), any kernel size and dilation.  pad_top/pad_left:
// the forward's.  K > 0: as in depthwise_fwd_planes.
template <typename T, typename I, int K = 0>
__global__ void depthwise_bwd_input_planes(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                           T* __restrict__ grad_x, I images, int channels, int multiplier,
                                           int height, int width, int out_h, int out_w, int kernel_h, int kernel_w,
                                           int dilation_h, int dilation_w, int pad_top, int pad_left) {
  // the padding of the equivalent correlation
  const int top = (kernel_h - 1) * dilation_h - pad_top, left = (kernel_w - 1) * dilation_w - pad_left;
  depthwise_planes<T, I, true, K>(grad_out, weight, weight, grad_x, images, channels, multiplier, out_h, out_w,
                                  height, width, kernel_h, kernel_w, 1, 1, dilation_h, dilation_w, top, left, 0);
}

// Input gradient at any stride (used for stride > 1): a gather from a staged grad_out region.  The unit stages
// the grad_out rows and columns its tile of input pixels reads (the m planes of the channel) and the m kernels;
// a pixel then sums exactly the windows that cover it.  A thread takes STRIDED_ROWS pixels of one column,
// tile_h / STRIDED_ROWS rows apart, and tile_h / STRIDED_ROWS and tile_w are multiples of the strides: so the
// staged rows each of its pixels reads, and the kernel tap of each, are the same in every unit up to a shift.
// They are solved once per thread, leaving a few instructions per tap (no division at dilation 1) and no index
// arithmetic per pixel.
__device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((b - 1 - a) / b); }
__device__ __forceinline__ int ceil_div(int a, int b) { return -floor_div(-a, b); }

// depthwise_bwd_input_phased's item (stride S, dilation 1): the B x B input pixels (B = S * PHASED_CELLS) of a block
// whose first row and column are multiples of B in the tile, with pad = S * P + O on each side (OY, OX: pad_top and
// pad_left mod S).  Pixel (r, c) of the block takes tap (ky, kx) where r + OY - ky and c + OX - kx are multiples of
// S, from staged grad_out row (r + OY - ky) / S - LO_Y of the block's window (LO: the least such offset,
// ceil((O - (K - 1)) / S)), column likewise.  All of it is known at compile time, so the block reads its window
// into registers once and each cell of S x S pixels costs K x K FMAs: no index arithmetic or predicate per tap.
template <typename A, int K, int S, int OY, int OX>
__device__ __forceinline__ void phased_block(const A* src, int pitch, const A (&w)[K][K],
                                             A (&acc)[S * PHASED_CELLS][S * PHASED_CELLS]) {
  constexpr int B = S * PHASED_CELLS;
  constexpr int LO_Y = -((K - 1 - OY) / S), LO_X = -((K - 1 - OX) / S);
  constexpr int ROWS = (B - 1 + OY) / S - LO_Y + 1, COLS = (B - 1 + OX) / S - LO_X + 1;
  A win[ROWS][COLS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
#pragma unroll
    for (int j = 0; j < COLS; ++j) win[i][j] = src[i * pitch + j];
  }
#pragma unroll
  for (int r = 0; r < B; ++r) {
#pragma unroll
    for (int c = 0; c < B; ++c) {
#pragma unroll
      for (int ky = (r + OY) % S; ky < K; ky += S) {
#pragma unroll
        for (int kx = (c + OX) % S; kx < K; kx += S)
          acc[r][c] += w[ky][kx] * win[(r + OY - ky) / S - LO_Y][(c + OX - kx) / S - LO_X];
      }
    }
  }
}

// The body of both strided kernels.  K = 0: any kernel size, stride and dilation (run-time loops over the rows and
// columns each pixel reads).  K > 0 (depthwise_bwd_input_phased: K x K, stride S, dilation 1): a thread item is a
// block of B x B pixels (phased_block: every pixel's taps fixed by its phase, the block's grad_out window in
// registers, K x K FMAs per cell of S x S pixels), written a row at a time with one B-element store.  Both are
// persistent (grid capped at FORWARD_BLOCKS by the planner): the unit's digits (tile column, tile row, channel,
// image group) are stepped by the digits of gridDim.x, as in depthwise_persistent, so no division per unit.
template <typename T, typename I, int K, int S, int PHASE = 0>
__device__ __forceinline__ void strided_gather(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                               T* __restrict__ grad_x, I images, int channels, int multiplier,
                                               int height, int width, int out_h, int out_w, int kernel_h,
                                               int kernel_w, int stride_h, int stride_w, int dilation_h,
                                               int dilation_w, int pad_top, int pad_left, int tile_h, int tile_w,
                                               int tiles_x, int tiles_y, int per_block) {
  typedef acc_t<T> A;
  constexpr int Q = STRIDED_ROWS;
  const int taps = kernel_h * kernel_w;
  // Staged grad_out rows of tile (ty, tx): ty * tile_h / stride_h + first_y + [0, in_h); columns likewise.
  // (The planner's _strided_staging computes the same sizes.)
  const int first_y = ceil_div(pad_top - (kernel_h - 1) * dilation_h, stride_h);
  const int first_x = ceil_div(pad_left - (kernel_w - 1) * dilation_w, stride_w);
  const int in_h = floor_div(tile_h - 1 + pad_top, stride_h) - first_y + 1;
  const int in_w = floor_div(tile_w - 1 + pad_left, stride_w) - first_x + 1;
  A* tile = reinterpret_cast<A*>(depthwise_smem);
  A* wshared = tile + per_block * multiplier * in_h * in_w;

  // This thread's pixels: rows y_l + q * pitch_y (q < Q), column x_l, of image p.  For the first, the staged
  // rows read are row_lo..row_hi, the first at kernel row offset dy_lo (tap row dy / dilation where divisible;
  // dy falls by stride_h per row); pixel q reads the rows q * pitch_y / stride_h further down.  Columns alike.
  // (K > 0: the B x B pixels from row y_l, column x_l, of image p; phased_block below.)
  constexpr int B = K > 0 ? S * PHASED_CELLS : 1;
  const int pitch_y = tile_h / Q;
  const int item_w = tile_w / B, item_rows = K > 0 ? tile_h / B : pitch_y;
  const int x_l = (int)threadIdx.x % item_w * B;
  const int y_l = (int)threadIdx.x / item_w % item_rows * B;
  const int p = (int)threadIdx.x / (item_w * item_rows);
  const int row_lo = ceil_div(y_l + pad_top - (kernel_h - 1) * dilation_h, stride_h) - first_y;
  const int row_hi = floor_div(y_l + pad_top, stride_h) - first_y;
  const int dy_lo = y_l + pad_top - (row_lo + first_y) * stride_h;
  const int col_lo = ceil_div(x_l + pad_left - (kernel_w - 1) * dilation_w, stride_w) - first_x;
  const int col_hi = floor_div(x_l + pad_left, stride_w) - first_x;
  const int dx_lo = x_l + pad_left - (col_lo + first_x) * stride_w;
  const int q_rows = pitch_y / stride_h;  // staged rows between two of the thread's pixels
  const bool out_aligned = width % B == 0 && reinterpret_cast<unsigned long long>(grad_x) % (B * sizeof(T)) == 0;

  // The digits of the first unit and of the step (unit = ((g * channels + c) * tiles_y + ty) * tiles_x + tx).
  int tx, ty, c, tx_step, ty_step, c_step;
  I g, g_step;
  {
    int u = (int)blockIdx.x, v = (int)gridDim.x;
    tx = u % tiles_x, u /= tiles_x, tx_step = v % tiles_x, v /= tiles_x;
    ty = u % tiles_y, u /= tiles_y, ty_step = v % tiles_y, v /= tiles_y;
    c = u % channels, u /= channels, c_step = v % channels, v /= channels;
    g = u, g_step = v;
  }
  const I groups = (images + per_block - 1) / per_block;
  while (g < groups) {
    const I image0 = g * per_block;
    load_tiles<T, I>(tile, grad_out, images, image0, channels * multiplier, c * multiplier, multiplier,
                     per_block * multiplier, in_h, in_w, ty * (tile_h / stride_h) + first_y,
                     tx * (tile_w / stride_w) + first_x, out_h, out_w);
    for (int e = threadIdx.x; e < multiplier * taps; e += blockDim.x)
      wshared[e] = to_acc(weight[(I)c * multiplier * taps + e]);
    __syncthreads();

    const I n = image0 + p;
    const int x = tx * tile_w + x_l;
    if (p < per_block && n < images && x < width) {
      T* out = grad_x + (n * channels + c) * (I)height * width + x;
      if constexpr (K > 0) {
        A acc[B][B];
#pragma unroll
        for (int r = 0; r < B; ++r) {
#pragma unroll
          for (int col = 0; col < B; ++col) acc[r][col] = A(0);
        }
        for (int k = 0; k < multiplier; ++k) {
          A w[K][K];
#pragma unroll
          for (int i = 0; i < K * K; ++i) w[i / K][i % K] = wshared[k * (K * K) + i];
          // the block's window: from staged row y_l / S, column x_l / S (phased_block's offsets are relative to them)
          const A* plane = tile + ((p * multiplier + k) * in_h + y_l / S) * in_w + x_l / S;
          phased_block<A, K, S, PHASE / 2, PHASE % 2>(plane, in_w, w, acc);
        }
        // (x is a multiple of B below width, so a width that is one too leaves the block whole)
#pragma unroll
        for (int r = 0, y0 = ty * tile_h + y_l; r < B; ++r) {
          if (y0 + r >= height) break;
          T* row = out + (I)(y0 + r) * width;
          if (out_aligned) {
            Pack<T, B> packed;
#pragma unroll
            for (int col = 0; col < B; ++col) packed.v[col] = from_acc<T>(acc[r][col]);
            *reinterpret_cast<Pack<T, B>*>(row) = packed;
          } else {
#pragma unroll
            for (int col = 0; col < B; ++col) {
              if (x + col < width) row[col] = from_acc<T>(acc[r][col]);
            }
          }
        }
      } else {
#pragma unroll
        for (int q = 0; q < Q; ++q) {
          const int y = ty * tile_h + y_l + q * pitch_y;
          if (y >= height) break;
          A acc = A(0);
          for (int k = 0; k < multiplier; ++k) {
            const A* plane = tile + ((p * multiplier + k) * in_h + q * q_rows) * in_w;
            const A* wk = wshared + k * taps;
            for (int r = row_lo, dy = dy_lo; r <= row_hi; ++r, dy -= stride_h) {
              if (dilation_h > 1 && dy % dilation_h) continue;
              const A* wrow = wk + (dilation_h == 1 ? dy : dy / dilation_h) * kernel_w;
              for (int col = col_lo, dx = dx_lo; col <= col_hi; ++col, dx -= stride_w) {
                if (dilation_w > 1 && dx % dilation_w) continue;
                acc += wrow[dilation_w == 1 ? dx : dx / dilation_w] * plane[r * in_w + col];
              }
            }
          }
          out[(I)y * width] = from_acc<T>(acc);
        }
      }
    }
    __syncthreads();  // the next unit overwrites the tiles

    int carry = 0;
    next_digit(tx, tx_step, tiles_x, carry);
    next_digit(ty, ty_step, tiles_y, carry);
    next_digit(c, c_step, channels, carry);
    g += g_step + carry;
  }
}

template <typename T, typename I>
__global__ void depthwise_bwd_input_strided(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                            T* __restrict__ grad_x, I images, int channels, int multiplier,
                                            int height, int width, int out_h, int out_w, int kernel_h,
                                            int kernel_w, int stride_h, int stride_w, int dilation_h,
                                            int dilation_w, int pad_top, int pad_left, int tile_h, int tile_w,
                                            int tiles_x, int tiles_y, int per_block) {
  strided_gather<T, I, 0, 0>(grad_out, weight, grad_x, images, channels, multiplier, height, width, out_h, out_w,
                             kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left,
                             tile_h, tile_w, tiles_x, tiles_y, per_block);
}

// The same for a K x K kernel (K = 3, 5, 7) at stride S (2) in both dimensions, dilation 1.  PHASE = (pad_top mod 2)
// * 2 + pad_left mod 2, phased_block's OY and OX: one copy of the loop over units each, chosen once (a switch in the
// loop left the four blocks of FMAs without a load of their own: the compiler shares the same-address window loads
// before it, and the executed-instruction model then charged every block with them, 4x the FMAs).
template <typename T, typename I, int K, int S>
__global__ void depthwise_bwd_input_phased(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                           T* __restrict__ grad_x, I images, int channels, int multiplier,
                                           int height, int width, int out_h, int out_w, int pad_top, int pad_left,
                                           int tile_h, int tile_w, int tiles_x, int tiles_y, int per_block) {
  static_assert(S == 2, "the phases are dispatched for stride 2");
#define PHASED_CASE(PHASE)                                                                                          \
  strided_gather<T, I, K, S, PHASE>(grad_out, weight, grad_x, images, channels, multiplier, height, width, out_h,  \
                                    out_w, K, K, S, S, 1, 1, pad_top, pad_left, tile_h, tile_w, tiles_x, tiles_y,   \
                                    per_block)
  switch (pad_top % S * 2 + pad_left % S) {
    case 0: PHASED_CASE(0); break;
    case 1: PHASED_CASE(1); break;
    case 2: PHASED_CASE(2); break;
    default: PHASED_CASE(3);
  }
#undef PHASED_CASE
}

// ---------------------------------------------------------------------------------------------------------
// Weight (and bias) gradient, stage 1.  Block b handles output channel co = b % (C * m) over the units
// [r * units_per_block, (r + 1) * units_per_block) of that channel, r = b / (C * m) (a unit: one output tile of
// per_block images).  Threads are mapped over (image, strip, column) items, so even a 4x4 plane keeps every lane
// busy; each accumulates its taps in registers over all the block's units, then the block reduces them in a
// fixed order and writes partial row r: partial[r][co * taps + tap], and partial[r][C * m * taps + co] for the
// bias when has_bias (put_sum; finish_rows adds the rows).  depthwise_bwd_weight<K, S> slides the forward's register
// window over the x tile;
// depthwise_bwd_weight_generic takes the taps in passes of TAP_CHUNK (one pass up to 4x4, at most two: the planner
// sends larger kernels to depthwise_bwd_weight_large).
// The weight and bias gradients are finished in the launch that sums them (no second launch): a block stores row r of
// its channel's (or channel group's) sums through put_sum, straight into `out` (converted) where there is one row,
// else into partial.  After its loop over blocks b (blockIdx.x, + gridDim.x, ...: b % slots the slot, a channel or
// a group of `group` channels), the block calls finish_rows, which counts it in at each of its slots (last_arrival,
// common.cuh: one count a slot in `arrivals`, left at 0); where it is the last of the slot's `rows` blocks, it adds
// rows 0, 1, ... of each of the slot's elements (its channels' taps, then their biases where has_bias) in that order
// and converts (finish_slot), so the bits are the same whatever block arrives last.  A thread takes elements
// blockDim.x apart, the loads of FINISH_ROWS rows in flight.  STORED: the kernel stores even a single row in partial
// (depthwise_bwd_weight_lanes, whose 16-bit instantiations put_sum's branch cost a stack frame at their 64 registers),
// which the finish then converts.  Where the finish goes was measured (NVRTC 13, sm_90): in the loop, at the end of a
// block's pass, it cost the 5x5 weight gradient 15-27 registers (96 -> 111-123, 10 -> 8 blocks an SM); after the
// loop with finish_slot inlined, 29; as a call, none.
template <typename T, typename I>
__device__ __forceinline__ void put_sum(acc_t<T>* partial, T* out, I rows, I r, I row_length, I e, acc_t<T> total) {
  if (rows == 1)
    out[e] = from_acc<T>(total);
  else
    partial[r * row_length + e] = total;
}

// The last block's sums of channels c0 .. c0 + n - 1.
template <typename T, typename I>
__device__ __noinline__ void finish_slot(const acc_t<T>* partial, T* out, I rows, I row_length, int c0, int n,
                                         int channels, int taps, int has_bias) {
  typedef acc_t<T> A;
  const int count = n * taps;
  for (int k = threadIdx.x; k < count + (has_bias ? n : 0); k += blockDim.x) {
    const I e = k < count ? (I)c0 * taps + k : (I)channels * taps + c0 + (k - count);
    A total = A(0);
    for (I r = 0; r < rows; r += FINISH_ROWS) {
      A v[FINISH_ROWS];
#pragma unroll
      for (int q = 0; q < FINISH_ROWS; ++q) v[q] = r + q < rows ? __ldcg(partial + (r + q) * row_length + e) : A(0);
#pragma unroll
      for (int q = 0; q < FINISH_ROWS; ++q) total += v[q];
    }
    out[e] = from_acc<T>(total);
  }
}

// finish_rows_at: last_arrival's verdict in `flag` (depthwise_bwd_bias: a word of its block_reduce scratch, whose
// static shared memory a variable of its own would pad differently in the fast and the optimised compiles).
template <typename T, typename I, bool STORED = false>
__device__ __forceinline__ void finish_rows_at(int* flag, const acc_t<T>* partial, T* out, int* arrivals, I rows,
                                               I blocks, int slots, int group, int channels, int taps, int has_bias) {
  if (rows == 1 && !STORED) return;  // put_sum wrote the gradients
  for (I b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int slot = (int)(b % slots), c0 = slot * group;
    if (last_arrival(arrivals, slot, (int)rows, flag))
      finish_slot<T, I>(partial, out, rows, (I)channels * (taps + has_bias), c0, min(group, channels - c0), channels,
                        taps, has_bias);
  }
}

template <typename T, typename I, bool STORED = false>
__device__ __forceinline__ void finish_rows(const acc_t<T>* partial, T* out, int* arrivals, I rows, I blocks,
                                            int slots, int group, int channels, int taps, int has_bias) {
  __shared__ int last;
  finish_rows_at<T, I, STORED>(&last, partial, out, arrivals, rows, blocks, slots, group, channels, taps, has_bias);
}

// The partial rows of a stage 1 over tiled units: `units` per output channel (ceil(images / per_block) * tiles),
// grouped units_per_block to a row; row r covers the units [begin(r), end(r)) of its channel.
template <typename I> struct WeightRows {
  I units, per_row, count;
  __device__ WeightRows(I images, int per_block, int tiles, I units_per_block)
      : units((images + per_block - 1) / per_block * tiles), per_row(units_per_block),
        count((units + units_per_block - 1) / units_per_block) {}
  __device__ I begin(I r) const { return r * per_row; }
  __device__ I end(I r) const { return min(units, (r + 1) * per_row); }
};

// Tiny planes (plane_channels > 0: the planner's choice where both planes have at most PLANE_MAX elements).  Tiled, a
// 4x4 plane is a unit of ~85 images of one channel whose staged rows are 4 elements and whose grad_out strips are
// read a row (out_w elements) apart.  Here thread (s, q) = (threadIdx.x / Q, threadIdx.x % Q), Q = plane_channels (a
// power of two up to 32), owns output channel co0 + q of image n0 + s: a unit is S = blockDim.x / Q images of the
// block's Q consecutive output channels, whose grad_out planes are S contiguous runs (and their x planes S runs of
// input channels), staged with coalesced element loads and pitched to an odd number of words, so that the lanes of
// a warp (consecutive channels, each reading the same element of its own plane) hit 32 banks.  Each tap of a pass
// runs over exactly the outputs that read inside the plane (their box, staged once per pass: `boxes`); a thread's
// sums stay in its own shared-memory slots over the block's units (a register array would need the tap loop
// unrolled, 16 copies of its loops next to the tiled code), and the S images of a channel are added in slot order
// at the end: a fixed order.  Block b: channel group b % groups, partial row b / groups, units of S images.
// One image's share of a thread's K x K tap sums and bias sum (acc[K * K]) with its x plane (at most K x K) in
// registers (weight_grad_planes' in_registers): grad_out's element (u + pad_top, v + pad_left) of the g plane (staged
// flat, raw) times x at (u + i, v + j), over the taps that land inside x, outputs in row order and taps in order within
// each, as the padded version sums them (its other taps add products with its zero padding: the sums stay the same).
template <typename T, int K>
__device__ __forceinline__ void register_window_grad(acc_t<T> (&acc)[K * K + 1], const acc_t<T> (&x)[K * K],
                                                     const T* g_plane, int out_h, int out_w, int pad_top,
                                                     int pad_left) {
  typedef acc_t<T> A;
  in_plane_outputs<K>(out_h, out_w, pad_top, pad_left, [&](int oy, int ox, int u, int v) {
    const A g = to_acc(g_plane[oy * out_w + ox]);
    in_plane_taps<K>(u, v, [&](int tap, int at) { acc[tap] += g * x[at]; });
    acc[K * K] += g;
  });
}

// K > 0 (depthwise_bwd_weight_planes: the forward's TINY_KERNELS window, depthwise_planes): the x planes are staged
// zero-padded as depthwise_planes stages them, and a thread's K * K sums (and its bias sum) stay in registers over its
// units: every output adds g * x at the K * K offsets of its window, known at compile time, instead of a box loop a
// tap; the sums go to the thread's slots after its last unit, for the same slot-order reduction.
template <typename T, typename I, int K = 0>
__device__ __forceinline__ void weight_grad_planes(const T* __restrict__ x, const T* __restrict__ grad_out,
                                                   acc_t<T>* __restrict__ partial, T* __restrict__ out,
                                                   int* __restrict__ arrivals, I images, int channels,
                                                   int multiplier, int height, int width, int out_h, int out_w,
                                                   int kernel_h, int kernel_w, int stride_h, int stride_w,
                                                   int dilation_h, int dilation_w, int pad_top, int pad_left,
                                                   I units_per_block, int has_bias, int plane_channels) {
  typedef acc_t<T> A;
  constexpr int R = TAP_CHUNK;  // taps per pass
  const int Q = plane_channels, S = (int)blockDim.x / Q;
  const int q = (int)threadIdx.x % Q, s = (int)threadIdx.x / Q;
  const int taps = kernel_h * kernel_w, out_channels = channels * multiplier, groups = (out_channels + Q - 1) / Q;
  const int x_size = height * width, g_size = out_h * out_w;
  const int pad_w = K ? out_w + K - 1 : width;  // K: x planes zero-padded to pad_w columns
  const int x_pitch = (K ? (out_h + K - 1) * pad_w : x_size) | 1, g_pitch = g_size | 1;  // odd: no bank conflicts
  const I row_length = (I)out_channels * (taps + has_bias);
  int* boxes = reinterpret_cast<int*>(depthwise_smem);  // per tap of the pass: output rows, columns, x offset
  A* sums = reinterpret_cast<A*>(boxes + 3 * R);         // per thread: its R tap sums, then its bias sum
  A* xs = sums + blockDim.x * (R + 1);                   // S x Q x planes (fewer with a multiplier)
  A* gs = xs + S * Q * x_pitch;                          // S x Q grad_out planes
  int* pad_at = reinterpret_cast<int*>(gs + S * Q * g_pitch);  // K: x element -> offset in its staged plane
  A* own = sums + threadIdx.x * (R + 1);                 // R + 1 odd: a warp's slots on 32 banks
  const PlaneWalk x_walk(x_size), g_walk(g_size);
  bool whole = false;  // K, in registers: 16-byte loads of whole x planes
  const bool in_registers = K > 0 && planes_in_registers<K ? K : 1>(x, height, width, whole);
  if constexpr (K > 0) {
    if (!in_registers) {
      for (int e = threadIdx.x; e < S * Q * x_pitch; e += blockDim.x) xs[e] = A(0);
      for (int e = threadIdx.x; e < x_size; e += blockDim.x)
        pad_at[e] = (e / width + pad_top) * pad_w + e % width + pad_left;
    }
    __syncthreads();
  }
  const WeightRows<I> rows(images, S, 1, units_per_block);
  for (I b = blockIdx.x; b < rows.count * groups; b += gridDim.x) {
    const int co0 = (int)(b % groups) * Q, count = min(Q, out_channels - co0);
    const int c0 = co0 / multiplier, x_count = (co0 + count - 1) / multiplier - c0 + 1;
    const I r = b / groups, unit_end = rows.end(r);
    for (int t0 = 0; t0 < taps; t0 += R) {
      for (int t = threadIdx.x; t < R; t += blockDim.x) {
        // Output (oy, ox) reads x at (oy * stride_h + dy, ox * stride_w + dx) through tap (i, j).
        const int tap = min(t0 + t, taps - 1), dy = tap / kernel_w * dilation_h - pad_top;
        const int dx = (tap % kernel_w) * dilation_w - pad_left;
        const int y_lo = min(out_h, max(0, ceil_div(-dy, stride_h)));
        const int x_lo = min(out_w, max(0, ceil_div(-dx, stride_w)));
        const int y_hi = max(y_lo, min(out_h, floor_div(height - 1 - dy, stride_h) + 1));
        const int x_hi = max(x_lo, min(out_w, floor_div(width - 1 - dx, stride_w) + 1));
        boxes[3 * t] = y_lo | y_hi << 16, boxes[3 * t + 1] = x_lo | x_hi << 16, boxes[3 * t + 2] = dy * width + dx;
      }
      for (int t = 0; t <= R; ++t) own[t] = A(0);  // taps t0 .. t0 + R - 1, then the bias
      A acc[K ? K * K + 1 : 1];  // K: the thread's tap sums, then its bias sum
#pragma unroll
      for (int t = 0; t < (K ? K * K + 1 : 1); ++t) acc[t] = A(0);
      for (I unit = rows.begin(r); unit < unit_end; ++unit) {
        const I n0 = unit * S;
        for (int slot = 0; slot < S && n0 + slot < images; ++slot) {
          const T* x_run = x + ((n0 + slot) * channels + c0) * (I)x_size;
          const T* g_run = grad_out + ((n0 + slot) * out_channels + co0) * (I)g_size;
          A* x_dst = xs + slot * Q * x_pitch;
          A* g_dst = gs + slot * Q * g_pitch;
          if constexpr (K > 0) {  // in registers: whole x planes straight from global memory, others flat
            if (in_registers) {
              if (!whole) stage_flat(reinterpret_cast<T*>(xs) + slot * Q * x_size, x_run, x_count * x_size);
              stage_flat(reinterpret_cast<T*>(gs) + slot * Q * g_size, g_run, count * g_size);
            } else {
              stage_batched<true>(x_dst, x_run, x_count * x_size, x_walk, x_pitch, pad_at);
              stage_batched<false>(g_dst, g_run, count * g_size, g_walk, g_pitch, pad_at);
            }
          } else {
            PlaneWalk at = x_walk;
            for (int e = threadIdx.x; e < x_count * x_size; e += blockDim.x, at.next())
              x_dst[at.q * x_pitch + at.r] = to_acc(x_run[e]);
            at = g_walk;
            for (int e = threadIdx.x; e < count * g_size; e += blockDim.x, at.next())
              g_dst[at.q * g_pitch + at.r] = to_acc(g_run[e]);
          }
        }
        __syncthreads();
        if (q < count && n0 + s < images) {
          const A* xp = xs + (s * Q + (co0 + q) / multiplier - c0) * x_pitch;
          const A* gp = gs + (s * Q + q) * g_pitch;
          if constexpr (K > 0) {
            if (in_registers) {
              const int xq = s * Q + (co0 + q) / multiplier - c0;  // the thread's x plane in the unit
              A xr[K * K];
              if (whole)
                load_plane<K>(xr, x + ((n0 + s) * channels + c0 + xq - s * Q) * (I)x_size, K, K, true);
              else
                load_plane<K>(xr, reinterpret_cast<const T*>(xs) + xq * x_size, height, width, false);
              register_window_grad<T, K>(acc, xr, reinterpret_cast<const T*>(gs) + (s * Q + q) * g_size, out_h,
                                         out_w, pad_top, pad_left);
            } else {
              for (int oy = 0; oy < out_h; ++oy) {
                for (int ox = 0; ox < out_w; ++ox) {
                  const A g = gp[oy * out_w + ox], *window = xp + oy * pad_w + ox;
#pragma unroll
                  for (int i = 0; i < K; ++i) {
#pragma unroll
                    for (int jj = 0; jj < K; ++jj) acc[i * K + jj] += g * window[i * pad_w + jj];
                  }
                  acc[K * K] += g;
                }
              }
            }
          } else {
            const int row_step = stride_h * width, pass_taps = min(R, taps - t0);
            for (int t = 0; t < pass_taps; ++t) {
              const int ys = boxes[3 * t], xb = boxes[3 * t + 1], offset = boxes[3 * t + 2];
              const int x_lo = xb & 0xffff, x_hi = xb >> 16;
              A sum = own[t];
              for (int oy = ys & 0xffff; oy < ys >> 16; ++oy) {
                const A* g_row = gp + oy * out_w;
                const A* x_row = xp + (oy * row_step + offset);
                for (int ox = x_lo; ox < x_hi; ++ox) sum += g_row[ox] * x_row[ox * stride_w];
              }
              own[t] = sum;
            }
            if (t0 == 0 && has_bias) {
              A sum = own[R];
              for (int e = 0; e < g_size; ++e) sum += gp[e];
              own[R] = sum;
            }
          }
        }
        __syncthreads();  // the next unit overwrites the planes; after the last, every thread's sums are in
      }
      if constexpr (K > 0) {
#pragma unroll
        for (int t = 0; t < K * K; ++t) own[t] = acc[t];
        own[R] = acc[K * K];
        __syncthreads();
      }
      for (int e = threadIdx.x; e < count * (R + 1); e += blockDim.x) {  // (channel q, tap t): consecutive taps
        const int qe = e / (R + 1), t = e % (R + 1);
        if (t < R ? t0 + t >= taps : t0 > 0 || !has_bias) continue;
        A total = A(0);
        for (int slot = 0; slot < S; ++slot) total += sums[(slot * Q + qe) * (R + 1) + t];
        put_sum<T, I>(partial, out, rows.count, r, row_length,
                      t < R ? (I)(co0 + qe) * taps + t0 + t : (I)out_channels * taps + co0 + qe, total);
      }
      __syncthreads();  // the next pass clears the sums
    }
  }
  finish_rows<T, I>(partial, out, arrivals, rows.count, rows.count * groups, groups, Q, out_channels, taps, has_bias);
}

template <typename T, typename I>
__global__ void depthwise_bwd_weight_generic(const T* __restrict__ x, const T* __restrict__ grad_out,
                                             acc_t<T>* __restrict__ partial, T* __restrict__ out,
                                             int* __restrict__ arrivals, I images, int channels,
                                             int multiplier, int height, int width, int out_h, int out_w,
                                             int kernel_h, int kernel_w, int stride_h, int stride_w,
                                             int dilation_h, int dilation_w, int pad_top, int pad_left, int tile_h,
                                             int tile_w, int tiles_x, int tiles_y, int per_block,
                                             I units_per_block, int has_bias, int plane_channels) {
  typedef acc_t<T> A;
  if (plane_channels > 0) {
    weight_grad_planes<T, I>(x, grad_out, partial, out, arrivals, images, channels, multiplier, height, width,
                             out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top,
                             pad_left, units_per_block, has_bias, plane_channels);
    return;
  }
  constexpr int V = GENERIC_STRIP, R = TAP_CHUNK;  // R: taps per pass, accumulated in registers
  const int taps = kernel_h * kernel_w;
  const int in_h = (tile_h - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
  const int in_w = (tile_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
  A* tile = reinterpret_cast<A*>(depthwise_smem);
  A* scratch = tile + per_block * in_h * in_w;
  const int out_channels = channels * multiplier;
  const I row_length = (I)out_channels * (taps + has_bias);

  const int strips = tile_h / V;
  const int ox_l = (int)threadIdx.x % tile_w;
  const int s = (int)threadIdx.x / tile_w % strips;
  const int p = (int)threadIdx.x / (tile_w * strips);
  const int tiles = tiles_x * tiles_y;
  const WeightRows<I> rows(images, per_block, tiles, units_per_block);
  for (I b = blockIdx.x; b < rows.count * out_channels; b += gridDim.x) {
    const int co = (int)(b % out_channels), c = co / multiplier;
    const I r = b / out_channels, unit_end = rows.end(r);
    for (int t0 = 0; t0 < taps; t0 += R) {
      int offset[R];  // shared-memory offset of tap t0 + t from the item's window origin
#pragma unroll
      for (int t = 0; t < R; ++t) {
        const int tap = min(t0 + t, taps - 1);
        offset[t] = tap / kernel_w * dilation_h * in_w + tap % kernel_w * dilation_w;
      }
      A acc[R + 1];  // taps t0 .. t0 + R - 1, then the bias
#pragma unroll
      for (int t = 0; t <= R; ++t) acc[t] = A(0);
      for (I unit = rows.begin(r); unit < unit_end; ++unit) {
        const int t = (int)(unit % tiles);
        const I image0 = unit / tiles * per_block;
        const int oy0 = t / tiles_x * tile_h, ox0 = t % tiles_x * tile_w;
        load_tiles<T, I>(tile, x, images, image0, channels, c, 1, per_block, in_h, in_w,
                         oy0 * stride_h - pad_top, ox0 * stride_w - pad_left, height, width);
        __syncthreads();
        const I n = image0 + p;
        const int ox = ox0 + ox_l;
        if (p < per_block && n < images && ox < out_w) {
          const T* g_col = grad_out + (n * out_channels + co) * (I)out_h * out_w + ox;
          A g[V];
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const int oy = oy0 + s * V + v;
            g[v] = oy < out_h ? to_acc(g_col[(I)oy * out_w]) : A(0);
          }
          const A* base = tile + (p * in_h + s * V * stride_h) * in_w + ox_l * stride_w;
          const int step = stride_h * in_w;
#pragma unroll
          for (int t = 0; t < R; ++t) {
            if (t0 + t < taps) {
#pragma unroll
              for (int v = 0; v < V; ++v) acc[t] += g[v] * base[v * step + offset[t]];
            }
          }
          if (t0 == 0) {
#pragma unroll
            for (int v = 0; v < V; ++v) acc[R] += g[v];
          }
        }
        __syncthreads();  // the next unit overwrites the tiles
      }
      block_reduce(acc, scratch, [&](int t, A total) {
        if (t < R && t0 + t < taps)
          put_sum<T, I>(partial, out, rows.count, r, row_length, (I)co * taps + t0 + t, total);
        if (t == R && t0 == 0 && has_bias)
          put_sum<T, I>(partial, out, rows.count, r, row_length, (I)out_channels * taps + co, total);
      });
    }
  }
  finish_rows<T, I>(partial, out, arrivals, rows.count, rows.count * out_channels, out_channels, 1, out_channels, taps,
                    has_bias);
}

// Weight gradient of tiny planes with the forward's TINY_KERNELS window (weight_grad_planes' K > 0): the parameters
// of depthwise_bwd_weight_generic, its tiling arguments unused (plane_channels > 0); launch bounds as the forward's.
template <typename T, typename I, int K>
__global__ void __launch_bounds__(256, planes_min_blocks<I, K>)
    depthwise_bwd_weight_planes(const T* __restrict__ x, const T* __restrict__ grad_out,
                                acc_t<T>* __restrict__ partial, T* __restrict__ out, int* __restrict__ arrivals,
                                I images, int channels, int multiplier,
                                int height, int width, int out_h, int out_w, int kernel_h, int kernel_w,
                                int stride_h, int stride_w, int dilation_h, int dilation_w, int pad_top,
                                int pad_left, int tile_h, int tile_w, int tiles_x, int tiles_y,
                                int per_block, I units_per_block, int has_bias, int plane_channels) {
  weight_grad_planes<T, I, K>(x, grad_out, partial, out, arrivals, images, channels, multiplier, height, width,
                              out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top,
                              pad_left, units_per_block, has_bias, plane_channels);
}

// acc[i * K + j] += g[v][u] * x[v * S + i][u * S + j] over an item's V x U outputs, the staged rows read in order by
// load_rows(rr, row) (whatever the staging: the same products in the same order)
template <int K, int S, typename A, int V, int U, typename LoadRows>
__device__ __forceinline__ void weight_products(A (&acc)[K * K + 1], const A (&gv)[V][U], LoadRows load_rows) {
  constexpr int L = (U - 1) * S + K;
#pragma unroll
  for (int rr = 0; rr < (V - 1) * S + K; ++rr) {
    A row[L];
    load_rows(rr, row);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int i = rr - v * S;
      if (i >= 0 && i < K) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int j = 0; j < K; ++j) acc[i * K + j] += gv[v][u] * row[u * S + j];
        }
      }
    }
  }
}

// Weight (and bias) gradient, stage 1, K x K kernel (K = 3, 5, 7), stride S (1, 2), dilation 1: the blocks,
// units and partial rows of depthwise_bwd_weight_generic with the forward's thread items and staging.  A thread owns a
// V x U block of outputs (V = STRIP_ROWS_K, U = FWD_COLUMNS): per unit it reads their grad_out values (one
// U-element load per row where the rows are aligned, issued before the barrier), then slides down the staged x
// rows ((U - 1) * S + K values each, 16-byte shared loads) adding g * x to its K * K tap sums, so a staged value
// feeds up to U * ceil(K / S) products.  The block's units are consecutive, so the unit digits (tile column, tile
// row, image group) are stepped by one, without division.  The sums stay in registers over the block's units and
// are reduced once, in block_reduce's fixed order.  SPREAD: the instantiation for whole-plane tiles (small planes)
// and for tiles whose row of thread items spans less than a bank row (as depthwise_fwd's SPREAD), thread items and
// staged planes laid out as AlignedStaging describes.  PAIRS: 16-bit data on whole-plane tiles of even rows that are
// not whole 16-byte chunks (14x14), staged flat by pairs (below; its own instantiations, so that the other planes keep
// their code and registers).
template <typename T, typename I, int K, int S, bool SPREAD = false, bool PAIRS = false>
__global__ void depthwise_bwd_weight(const T* __restrict__ x, const T* __restrict__ grad_out,
                                     acc_t<T>* __restrict__ partial, T* __restrict__ out, int* __restrict__ arrivals,
                                     I images, int channels, int multiplier,
                                     int height, int width, int out_h, int out_w, int pad_top, int pad_left,
                                     int tile_h, int tile_w, int tiles_x, int tiles_y, int per_block,
                                     I units_per_block, int has_bias) {
  typedef acc_t<T> A;
  constexpr int V = StripRows<K>::value, U = FWD_COLUMNS, R = K * K, L = (U - 1) * S + K;
  const int in_h = (tile_h - 1) * S + K, in_w = (tile_w - 1) * S + K;
  // SPLIT: per-image tiles at stride 2 stage their rows de-interleaved, as the forward's (AlignedStaging says why;
  // PREDICTED dw-96-112s2 shared wavefronts a 16-byte load 6.5 -> 3.5, the forward's)
  constexpr int SPLIT = S == 2 && !SPREAD && !PAIRS ? V * S : 0;
  const AlignedStaging<T, I, SPREAD, PAIRS, SPLIT> staging(x, width, in_h, in_w, tile_w * S);
  const int pitch = staging.pitch;
  A* tile = reinterpret_cast<A*>(depthwise_smem);
  A* scratch = tile + staging.offset(per_block, 0);
  const int out_channels = channels * multiplier;
  const I row_length = (I)out_channels * (R + has_bias);

  const ItemLayout<SPREAD> item(tile_w, tile_h, U, V, per_block);
  const int ox_l = item.ox_l, s = item.s, p = item.p;
  const bool rows_aligned = out_w % U == 0 &&
                            (reinterpret_cast<unsigned long long>(grad_out) % (U * sizeof(T))) == 0;
  const int tiles = tiles_x * tiles_y;
  // FLAT (the SPREAD instantiations of 32- and 64-bit data) on whole-plane tiles whose rows are not whole 16-byte
  // chunks (7x7, 14x14): a unit's per_block planes (images image0 .. of channel c) are staged flat, as
  // depthwise_persistent's packed runs, `batch` loads before their stores, instead of row by row, a wait each row
  // (PREDICTED dw-672-14k5 fp32: 150 -> 49 waits a warp, 78-237 -> 56-173 us).  Only plane cells are written, the
  // same ones every unit, so the halo is zeroed once a block; the planes of images past the batch keep stale values,
  // read by no active item.
  // 16-bit data (FLAT16): the stride-1 5x5 and 7x7 SPREAD instantiations with int indices, on planes of odd width
  // (7x7: no pairs), element by element as 32-bit data, 2 loads in flight (PREDICTED dw-1152-7k5 fp16: 92 -> 26 waits
  // a warp, 96 registers as before; a batch of 4 or 8 took 113-128 registers, 10 -> 8 blocks an SM; the stride-2, 3x3
  // and 64-bit instantiations took 3-31 more registers, so they keep the rows).  PAIRS: flat by aligned pairs of one
  // row (E = 2 elements a 4-byte load, a lane's batch of pairs in flight at once: PREDICTED dw-672-14k5 fp16 152 -> 16
  // waits a warp, by rows of pairs before), where no pair is cut by the staged columns' edge (padding on the left >= 0
  // and the plane inside the staged columns: always at stride 1).
  constexpr bool FLAT16 = S == 1 && K >= SPREAD_MIN_K && sizeof(I) == 4;
  constexpr bool FLAT = (SPREAD && (sizeof(T) >= 4 || FLAT16)) || PAIRS;
  constexpr int E = PAIRS ? 2 : 1;
  const bool flat_run = FLAT && tiles == 1 &&
                        (PAIRS ? staging.pairs && pad_left >= 0 && pad_left + width <= in_w :
                         !staging.rows_aligned && (sizeof(T) >= 4 || width % 2 == 1));
  // 32/64-bit: 4 or 8 (the forward's STAGE_BATCH) cost 18-32 registers: 10 -> 8 blocks an SM (5x5).
  constexpr int batch = PAIRS ? PairBatch<T, K>::value : 2;
  if (flat_run) {
    zero_tiles(tile, per_block * staging.plane);
    __syncthreads();
  }
  constexpr bool RAW16 = sizeof(T) == 2 && K == 3 && !PAIRS && CUPYCONV_HAS_CP_ASYNC;
  const RawStaging<T, I, SPREAD> raw(pad_left, in_h, in_w, tile_w * S);
  T* raw_tile = reinterpret_cast<T*>(tile);
  // the raw tiles in the float tiles' space (sizeof(A) / sizeof(T) halves a float), from whole slots
  const bool raw_run = RAW16 && staging.rows_aligned && tile_w * S % raw.SLOT == 0 &&
                       per_block * raw.plane <= staging.offset(per_block, 0) * (int)(sizeof(A) / sizeof(T));
  const WeightRows<I> rows(images, per_block, tiles, units_per_block);
  for (I b = blockIdx.x; b < rows.count * out_channels; b += gridDim.x) {
    const int co = (int)(b % out_channels), c = co / multiplier;
    const I r = b / out_channels, first = rows.begin(r), count = rows.end(r) - first;
    int tx = (int)(first % tiles), ty = tx / tiles_x;
    tx -= ty * tiles_x;
    I g = first / tiles;  // image group
    A acc[R + 1];  // the taps, then the bias
#pragma unroll
    for (int t = 0; t <= R; ++t) acc[t] = A(0);
    for (I e = 0; e < count; ++e) {
      const I image0 = g * per_block, n = image0 + p;
      const int oy0 = ty * tile_h, ox0 = tx * tile_w;
      const int ox = ox0 + ox_l, oy = oy0 + s * V;
      const bool active = item.valid && n < images && ox < out_w;
      if (flat_run) {
        const I plane_size = (I)height * width, plane_step = channels * plane_size;
        const T* first_plane = x + (image0 * channels + c) * plane_size;
        const int valid = (int)min((I)per_block, images - image0);
        // The walk is the same every unit, but kept over the unit loop it cost 32 registers (NVRTC 13, sm_90: 96 ->
        // 128 for the 5x5): worked out again each unit (its divisions), from a width the compiler cannot hoist.
        int w = width;
#ifndef __CUPYCONV_EMULATOR__
        asm volatile("" : "+r"(w));
#endif
        const RunWalk walk(w / E, height, pitch, staging.plane, pad_top, pad_left);
        stage_run<batch, T, E>(tile, walk, valid * (int)plane_size / E, width / E, height, pitch, staging.plane,
                               pad_top, pad_left, in_h, in_w, [&](int, const RunWalk& at) {
                                 if constexpr (E == 1) return first_plane[at.q * plane_step + at.y * width + at.x];
                                 else return *reinterpret_cast<const Pack<T, E>*>(first_plane + at.q * plane_step +
                                                                                  at.y * width + E * at.x);
                               });
      } else {
        const auto plane_of = [&](int q) -> const T* {
          const I image = image0 + q;
          return image < images ? x + (image * channels + c) * (I)height * width : nullptr;
        };
        if constexpr (RAW16) {
          if (raw_run) {
            raw.stage(raw_tile, per_block, oy0 * S - pad_top, ox0 * S - pad_left, height, width, x, plane_of);
            cp_async_commit();
          }
        }
        if (!raw_run) staging.stage(tile, per_block, oy0 * S - pad_top, ox0 * S - pad_left, height, width, plane_of);
      }
      // The item's grad_out values: every load issued before any is used, so that the warp waits for them once, not
      // once a row (each row's conversion next to its load, behind each row's branch: PREDICTED 14 waits a unit on
      // 14x14 planes, 4 on large ones).  Rows past the plane are zeros.
      A gv[V][U];  // zeros past the plane: those outputs add nothing
      {
        const T* gp = active ? grad_out + ((n * out_channels + co) * out_h + oy) * (I)out_w + ox : grad_out;
        if (rows_aligned && ox + U <= out_w) {
          Pack<T, U> packed[V];
#pragma unroll
          for (int v = 0; v < V; ++v) {
            // 16-bit data: every row loads, from a clamped address, no branch between the loads and their conversions
            // (NVRTC 13, sm_90: 96 registers in the 5x5 PAIRS, 117 with a branch a row); wider: a branch a row (96 in
            // the float 5x5 SPREAD, 115 clamped).
            const bool inside = active && oy + v < out_h;
#pragma unroll
            for (int u = 0; u < U; ++u) packed[v].v[u] = from_acc<T>(A(0));
            if (sizeof(T) == 2 || inside)
              packed[v] = *reinterpret_cast<const Pack<T, U>*>(inside ? gp + v * out_w : grad_out);
          }
#pragma unroll
          for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int u = 0; u < U; ++u) gv[v][u] = active && oy + v < out_h ? to_acc(packed[v].v[u]) : A(0);
          }
        } else {
          T raw[V][U];
#pragma unroll
          for (int v = 0; v < V; ++v, gp += out_w) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
              raw[v][u] = from_acc<T>(A(0));
              if (active && oy + v < out_h && ox + u < out_w) raw[v][u] = gp[u];
            }
          }
#pragma unroll
          for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int u = 0; u < U; ++u) gv[v][u] = to_acc(raw[v][u]);
          }
        }
      }
      if constexpr (RAW16) {
        if (raw_run) cp_async_wait<0>();
      }
      __syncthreads();
      if (active) {
        const auto staged_products = [&]() {
          const A* base = tile + staging.offset(p, s * V * S) + ox_l * (SPLIT ? 1 : S);
          weight_products<K, S>(acc, gv, [&](int rr, A(&row)[L]) {
            if constexpr (SPLIT > 0)
              load_split_row<A, L>(base + rr * pitch + rr / SPLIT * staging.skew, staging.odd0, row);
            else
              load_row<A, L>(base + rr * pitch, row);
          });
        };
        if constexpr (RAW16) {
          if (raw_run) {
            const T* at = raw_tile + p * raw.plane + s * V * S * raw.pitch + ox_l * S;
            const unsigned odd = raw.shift & 1 ? 0x5432u : 0x3210u;
            weight_products<K, S>(acc, gv,
                                  [&](int rr, A(&row)[L]) { load_raw_row(at + rr * raw.pitch, raw.shift, odd, row); });
          } else {
            staged_products();
          }
        } else {
          staged_products();
        }
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
          for (int u = 0; u < U; ++u) acc[R] += gv[v][u];
        }
      }
      __syncthreads();  // the next unit overwrites the tile
      if (++tx == tiles_x) {
        tx = 0;
        if (++ty == tiles_y) ty = 0, ++g;
      }
    }
    block_reduce(acc, scratch, [&](int t, A total) {
      if (t < R) put_sum<T, I>(partial, out, rows.count, r, row_length, (I)co * R + t, total);
      if (t == R && has_bias) put_sum<T, I>(partial, out, rows.count, r, row_length, (I)out_channels * R + co, total);
    });
  }
  finish_rows<T, I>(partial, out, arrivals, rows.count, rows.count * out_channels, out_channels, 1, out_channels, R,
                    has_bias);
}

// Weight (and bias) gradient, stage 1, for large kernels (31x31): the same blocks, units and partial rows as
// above, but the taps are spread over the threads instead of the pixels, since a block then has more taps than
// lanes and per-pixel accumulators would need one pass (and one block reduction) per TAP_CHUNK taps.  The unit
// stages its x tiles and its grad_out tiles; thread (task, slice) owns the LARGE_RUN consecutive taps
// (i, j0 .. j0 + LARGE_RUN - 1) of task = k * runs + j0 / LARGE_RUN, tap row i the k-th from the middle of the
// kernel outwards (middle, one above, one below, ...), and of the staged output rows whose tap row i reads
// inside the plane (the others read the staged zeros), slice, slice + slices, ... of them.  A 31x31 kernel
// padded 15 on a 14x14 plane reaches 14 rows with its middle row and 1 or none with its outer ones: skipping
// the zeros leaves 196 of 434 (tap row, output row) pairs, and the middle-out order gives the lanes of a warp
// tap rows with similar counts (a warp waits for its longest lane).  Along an output row, when stride_w ==
// dilation_w, tap j + 1 of output ox reads what tap j of output ox + 1 does: the run's x values slide through
// registers, one shared load (plus one broadcast grad_out load) per LARGE_RUN FMAs.  Each thread keeps its
// sums in registers over all the units; the slices are added in slice order at the end.  Deterministic, no
// block reduction per tap.
template <typename T, typename I>
__global__ void depthwise_bwd_weight_large(const T* __restrict__ x, const T* __restrict__ grad_out,
                                           acc_t<T>* __restrict__ partial, T* __restrict__ out,
                                           int* __restrict__ arrivals, I images, int channels,
                                           int multiplier, int height, int width, int out_h, int out_w,
                                           int kernel_h, int kernel_w, int stride_h, int stride_w, int dilation_h,
                                           int dilation_w, int pad_top, int pad_left, int tile_h, int tile_w,
                                           int tiles_x, int tiles_y, int per_block, I units_per_block,
                                           int has_bias) {
  typedef acc_t<T> A;
  constexpr int J = LARGE_RUN;
  const int taps = kernel_h * kernel_w;
  const int runs = (kernel_w + J - 1) / J;  // per kernel row
  const int tasks = kernel_h * runs;
  const int slices = blockDim.x / tasks;  // the planner launches at least `tasks` threads
  const int in_h = (tile_h - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
  const int in_w = (tile_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
  A* xs = reinterpret_cast<A*>(depthwise_smem);
  A* gs = xs + per_block * in_h * in_w;
  A* sums = gs + per_block * tile_h * tile_w;  // slices x (taps + 1)
  const int out_channels = channels * multiplier;
  const I row_length = (I)out_channels * (taps + has_bias);

  const int task = (int)threadIdx.x % tasks, slice = (int)threadIdx.x / tasks;
  const int k = task / runs, j0 = task % runs * J;
  const int i = kernel_h / 2 + (k & 1 ? -((k + 1) >> 1) : (k + 1) >> 1);  // middle, above, below, ...
  const int reach = i * dilation_h - pad_top;  // tap row i of output row oy reads input row oy * stride_h + reach
  const int tiles = tiles_x * tiles_y;
  const WeightRows<I> rows(images, per_block, tiles, units_per_block);
  for (I b = blockIdx.x; b < rows.count * out_channels; b += gridDim.x) {
    const int co = (int)(b % out_channels), c = co / multiplier;
    const I r = b / out_channels, unit_end = rows.end(r);
    A acc[J], bias_sum = A(0);
#pragma unroll
    for (int jj = 0; jj < J; ++jj) acc[jj] = A(0);
    for (I unit = rows.begin(r); unit < unit_end; ++unit) {
      const int t = (int)(unit % tiles);
      const I image0 = unit / tiles * per_block;
      const int oy0 = t / tiles_x * tile_h, ox0 = t % tiles_x * tile_w;
      load_tiles<T, I>(xs, x, images, image0, channels, c, 1, per_block, in_h, in_w, oy0 * stride_h - pad_top,
                       ox0 * stride_w - pad_left, height, width);
      load_tiles<T, I>(gs, grad_out, images, image0, out_channels, co, 1, per_block, tile_h, tile_w, oy0, ox0,
                       out_h, out_w);  // zeros past the plane: those outputs add nothing
      __syncthreads();
      if (slice < slices) {
        // The unit's output rows [oy_lo, oy_hi) whose tap row i reads inside the plane, of its `count` images.
        const int oy_lo = max(0, ceil_div(-reach, stride_h) - oy0);
        const int oy_hi = min(tile_h, floor_div(height - 1 - reach, stride_h) + 1 - oy0);
        const int span = max(0, oy_hi - oy_lo), count = (int)min((I)per_block, images - image0);
        for (int row = slice; row < count * span; row += slices) {  // (image p, output row) of the unit
          const int p = row / span, oy_l = oy_lo + row % span;
          const A* g = gs + (p * tile_h + oy_l) * tile_w;
          const A* xr = xs + (p * in_h + oy_l * stride_h + i * dilation_h) * in_w;
          if (stride_w == dilation_w) {
            // Column of tap j0 + jj of output ox: (ox + j0 + jj) * stride_w.  Columns past the tile only
            // occur for taps past the kernel's edge, whose sums are never stored.
            A win[J];
#pragma unroll
            for (int jj = 0; jj < J; ++jj) {
              const int col = (j0 + jj) * stride_w;
              win[jj] = col < in_w ? xr[col] : A(0);
            }
            for (int ox = 0; ox < tile_w; ++ox) {
              const A gv = g[ox];
#pragma unroll
              for (int jj = 0; jj < J; ++jj) acc[jj] += gv * win[jj];
#pragma unroll
              for (int jj = 0; jj + 1 < J; ++jj) win[jj] = win[jj + 1];
              const int col = (ox + 1 + j0 + J - 1) * stride_w;
              win[J - 1] = col < in_w ? xr[col] : A(0);
            }
          } else {
            for (int ox = 0; ox < tile_w; ++ox) {
              const A gv = g[ox];
#pragma unroll
              for (int jj = 0; jj < J; ++jj) {
                if (j0 + jj < kernel_w) acc[jj] += gv * xr[ox * stride_w + (j0 + jj) * dilation_w];
              }
            }
          }
        }
        if (task == 0 && has_bias) {  // every output row of every image
          for (int row = slice; row < per_block * tile_h; row += slices)
            for (int ox = 0; ox < tile_w; ++ox) bias_sum += gs[row * tile_w + ox];
        }
      }
      __syncthreads();  // the next unit overwrites the tiles
    }
    if (slice < slices) {
#pragma unroll
      for (int jj = 0; jj < J; ++jj) {
        if (j0 + jj < kernel_w) sums[slice * (taps + 1) + i * kernel_w + j0 + jj] = acc[jj];
      }
      if (task == 0) sums[slice * (taps + 1) + taps] = bias_sum;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < taps + has_bias; e += blockDim.x) {
      A total = A(0);
      for (int sl = 0; sl < slices; ++sl) total += sums[sl * (taps + 1) + e];
      put_sum<T, I>(partial, out, rows.count, r, row_length, e < taps ? (I)co * taps + e : (I)out_channels * taps + co,
                    total);
    }
    __syncthreads();
  }
  finish_rows<T, I>(partial, out, arrivals, rows.count, rows.count * out_channels, out_channels, 1, out_channels, taps,
                    has_bias);
}

// Weight (and bias) gradient, stage 1, of the windows depthwise_fwd_large takes (LARGE_MIN_K and up a side, stride 1,
// dilation 1, whole planes).  grad_w[co][i][j] = sum over images and outputs (oy, ox) of
// g[oy][ox] * x[i + oy - pad_top][j + ox - pad_left]: the forward's correlation (depthwise_large) with the kernel
// plane as its dst, x as its src and grad_out's plane as its weights, once per image.  So a thread item is the
// same LARGE_ROWS x LARGE_COLUMNS block, of taps, run over the grad_out rows and the chunks of x columns it reaches,
// 15 grad_out values (its kernel row, staged zero-padded as depthwise_large stages its weights) against the 8 x
// values of each of its 2 rows, 128 FMAs.  Here each lane has its own image's grad_out, so a unit's per_block
// images (a power of two, 8 at most) are the lanes of one item, every staged plane pitched as large_plane pitches
// them (a quarter warp's 16-byte loads: 8 images, 8 bank groups).  A thread takes one item in every unit of its
// block (the planner launches per_block threads an item) and keeps its sums in registers over the block's units;
// then the per_block lanes of an item add theirs in a fixed butterfly (shuffles) and partial row r gets the total,
// partial[r][co * taps + tap] (and the bias's, partial[r][C * m * taps + co], summed by the lanes of item 0 from
// the staged grad_out).  Deterministic: the same order whatever the scheduling.
// Blocks of LANES_THREADS an SM that depthwise_bwd_weight_lanes' registers must allow: 2 (64 registers) where it
// accumulates in float with int indices on sm_90 (94 registers unbounded, 16 warps an SM); 1 for double and 64-bit
// indices, and before sm_90, which spill at 64 (NVRTC 13, sm_80).
template <typename T, typename I> struct LanesBlocks {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr int value = 1;
#else
  static constexpr int value = sizeof(acc_t<T>) == 4 && sizeof(I) == 4 ? 2 : 1;
#endif
};

template <typename T, typename I>
__global__ void __launch_bounds__(LANES_THREADS, LanesBlocks<T, I>::value)
    depthwise_bwd_weight_lanes(const T* __restrict__ x, const T* __restrict__ grad_out, acc_t<T>* __restrict__ partial,
                               T* __restrict__ out, int* __restrict__ arrivals, I images, int channels,
                               int multiplier, int height, int width, int out_h, int out_w,
                               int kernel_h, int kernel_w, int pad_top, int pad_left, int per_block,
                               I units_per_block, int has_bias) {
  typedef acc_t<T> A;
  constexpr int Q = LARGE_ROWS, R = LARGE_COLUMNS, C = 16 / sizeof(A);
  const int taps = kernel_h * kernel_w;
  const int row_pitch = (width + R - 1) / R * R;  // staged x rows: zeros from width on
  const int plane = large_plane<A>(height, row_pitch);
  // grad_out column ox of an image's staged plane at ox + g_off (depthwise_large's w_off, with out_w for kernel_w)
  const int g_off = 2 * (R - 1) + ((-(R - 1 + pad_left)) % C + C) % C;
  const int g_pitch = (g_off + out_w + 2 * (R - 1) + C - 1) / C * C;
  const int g_plane = large_plane<A>(out_h, g_pitch);
  A* xs = reinterpret_cast<A*>(depthwise_smem);
  A* gs = xs + per_block * plane;
  const int out_channels = channels * multiplier;
  const I row_length = (I)out_channels * (taps + has_bias);
  const int groups = (kernel_w + R - 1) / R;  // items per Q kernel rows
  const int p = (int)threadIdx.x % per_block, item = (int)threadIdx.x / per_block;
  const int i0 = item / groups * Q, j0 = item % groups * R;  // the item's first tap
  // The grad_out rows and x columns some tap of the item reaches.
  const int oy_lo = max(0, pad_top - i0 - Q + 1), oy_hi = min(out_h, pad_top - i0 + height);
  const int x_lo = max(0, j0 - pad_left), x_hi = min(width, j0 + R - 1 - pad_left + out_w);
  const int c_lo = x_lo / R * R, c_hi = x_hi <= x_lo ? c_lo : x_hi;
  const WeightRows<I> rows(images, per_block, 1, units_per_block);

  for (I b = blockIdx.x; b < rows.count * out_channels; b += gridDim.x) {
    const int co = (int)(b % out_channels), c = co / multiplier;
    const I r = b / out_channels, unit_end = rows.end(r);
    A acc[Q][R], bias_sum = A(0);
#pragma unroll
    for (int v = 0; v < Q; ++v) {
#pragma unroll
      for (int u = 0; u < R; ++u) acc[v][u] = A(0);
    }
    for (I unit = rows.begin(r); unit < unit_end; ++unit) {
      const I image0 = unit * per_block;
      // The staging lanes worked out again each unit, from a block size the compiler cannot hoist: kept over the
      // loop, they cost the float instantiation a spill at its 64 registers once the finish followed (NVRTC 13, sm_90)
      int threads = (int)blockDim.x;
#ifndef __CUPYCONV_EMULATOR__
      asm volatile("" : "+r"(threads));
#endif
      const int x_lanes = min(row_pitch, threads), x_rows = threads / x_lanes;
      const int g_lanes = min(g_pitch, threads), g_rows = threads / g_lanes;
      if ((int)threadIdx.x < x_rows * x_lanes) {  // x planes: lanes along a row, as depthwise_large stages src
        int q = 0, y = (int)threadIdx.x / x_lanes;
        while (y >= height) { y -= height; ++q; }
        while (q < per_block) {
          const T* row = image0 + q < images ? x + (((image0 + q) * channels + c) * height + y) * (I)width : nullptr;
          A* to = xs + q * plane + y * row_pitch;
          for (int e = (int)threadIdx.x % x_lanes; e < row_pitch; e += x_lanes)
            to[e] = row != nullptr && e < width ? to_acc(row[e]) : A(0);
          y += x_rows;
          while (y >= height) { y -= height; ++q; }
        }
      }
      if ((int)threadIdx.x < g_rows * g_lanes) {  // grad_out planes, rows zero-padded
        int q = 0, y = (int)threadIdx.x / g_lanes;
        while (y >= out_h) { y -= out_h; ++q; }
        while (q < per_block) {
          const T* row = image0 + q < images ?
              grad_out + (((image0 + q) * out_channels + co) * out_h + y) * (I)out_w : nullptr;
          A* to = gs + q * g_plane + y * g_pitch;
          for (int e = (int)threadIdx.x % g_lanes; e < g_pitch; e += g_lanes) {
            const int ox = e - g_off;
            to[e] = row != nullptr && ox >= 0 && ox < out_w ? to_acc(row[ox]) : A(0);
          }
          y += g_rows;
          while (y >= out_h) { y -= out_h; ++q; }
        }
      }
      __syncthreads();
      const A* xp = xs + p * plane;
      // tap column j0 + u pairs x column e with grad_out column e - j0 - u + pad_left
      const A* gp = gs + p * g_plane + g_off + pad_left - (R - 1) - j0;
      for (int oy = oy_lo; oy < oy_hi; ++oy)  // x row i0 - pad_top + oy: tap row i0's
        large_row<A, Q, R>(gp + oy * g_pitch, xp, i0 - pad_top + oy, height, row_pitch, c_lo, c_hi, acc);
      if (has_bias && item == 0) {  // lane p sums its image's grad_out plane
        for (int y = 0; y < out_h; ++y)
          for (int ox = 0; ox < out_w; ++ox) bias_sum += gs[p * g_plane + y * g_pitch + g_off + ox];
      }
      __syncthreads();  // the next unit overwrites the planes
    }
    // The per_block lanes of an item (aligned within a warp) add their images' sums: a fixed butterfly.
    for (int offset = per_block / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int v = 0; v < Q; ++v) {
#pragma unroll
        for (int u = 0; u < R; ++u) acc[v][u] += __shfl_xor_sync(0xffffffffu, acc[v][u], offset);
      }
      bias_sum += __shfl_xor_sync(0xffffffffu, bias_sum, offset);
    }
    if (p == 0 && i0 < kernel_h) {  // a partial row even where it is the only one (finish_rows' STORED)
      A* row = partial + r * row_length;
#pragma unroll
      for (int v = 0; v < Q; ++v) {
#pragma unroll
        for (int u = 0; u < R; ++u) {
          if (i0 + v < kernel_h && j0 + u < kernel_w) row[(I)co * taps + (i0 + v) * kernel_w + j0 + u] = acc[v][u];
        }
      }
      if (has_bias && item == 0) row[(I)out_channels * taps + co] = bias_sum;
    }
  }
  finish_rows<T, I, true>(partial, out, arrivals, rows.count, rows.count * out_channels, out_channels, 1, out_channels,
                          taps, has_bias);
}

// Bias gradient alone: block b sums output channel co = b % (C * m) over the images
// [r * images_per_block, (r + 1) * images_per_block), r = b / (C * m), into partial[r][co], finished as the weight's.
template <typename T, typename I>
__global__ void depthwise_bwd_bias(const T* __restrict__ grad_out, acc_t<T>* __restrict__ partial,
                                   T* __restrict__ out, int* __restrict__ arrivals, I images, int out_channels,
                                   I pixels, I images_per_block) {
  typedef acc_t<T> A;
  __shared__ A scratch[32];
  const I rows = (images + images_per_block - 1) / images_per_block;
  for (I b = blockIdx.x; b < rows * out_channels; b += gridDim.x) {
    const int co = (int)(b % out_channels);
    const I r = b / out_channels;
    const I image0 = r * images_per_block;
    const I count = (min(images, image0 + images_per_block) - image0) * pixels;
    A acc[1] = {A(0)};
    // Items (image, pixel) in flat order: consecutive lanes read consecutive pixels of one plane.
    for (I e = threadIdx.x; e < count; e += blockDim.x)
      acc[0] += to_acc(grad_out[((image0 + e / pixels) * out_channels + co) * pixels + e % pixels]);
    block_reduce(acc, scratch,
                 [&](int, A total) { put_sum<T, I>(partial, out, rows, r, (I)out_channels, (I)co, total); });
  }
  finish_rows_at<T, I>(reinterpret_cast<int*>(scratch), partial, out, arrivals, rows, rows * out_channels, out_channels,
                       1, out_channels, 0, 1);
}

// ---------------------------------------------------------------------------------------------------------
// Kernels without shared memory, for geometries whose tile does not fit (huge dilated kernels) or whose windows
// do not overlap (nothing to share).

// Forward, one thread per output element, the window read straight from global memory.
template <typename T, typename I>
__global__ void depthwise_fwd_direct(const T* __restrict__ x, const T* __restrict__ weight,
                                     const T* __restrict__ bias, T* __restrict__ y, I images, int channels,
                                     int multiplier, int height, int width, int out_h, int out_w, int kernel_h,
                                     int kernel_w, int stride_h, int stride_w, int dilation_h, int dilation_w,
                                     int pad_top, int pad_left, int has_bias) {
  const int out_channels = channels * multiplier;
  const I total = images * out_channels * out_h * out_w;
  for (I index = grid_start<I>(); index < total; index += grid_stride<I>()) {
    const int ox = (int)(index % out_w);
    const int oy = (int)(index / out_w % out_h);
    const I plane = index / out_w / out_h;  // image * C * m + co
    const int co = (int)(plane % out_channels);
    const T* src = x + (plane / out_channels * channels + co / multiplier) * (I)height * width;
    const T* w = weight + (I)co * kernel_h * kernel_w;
    acc_t<T> sum = has_bias ? to_acc(bias[co]) : acc_t<T>(0);
    for (int i = 0; i < kernel_h; ++i) {
      const int yy = oy * stride_h - pad_top + i * dilation_h;
      if (yy < 0 || yy >= height) continue;
      for (int j = 0; j < kernel_w; ++j) {
        const int xx = ox * stride_w - pad_left + j * dilation_w;
        if (xx >= 0 && xx < width) sum += to_acc(w[i * kernel_w + j]) * to_acc(src[(I)yy * width + xx]);
      }
    }
    y[index] = from_acc<T>(sum);
  }
}

// Input gradient, any geometry, one thread per input pixel: it sums grad_out over exactly the windows that read
// it (output rows oy with oy * stride = y + pad - i * dilation, i in [0, kH), solved for the range first, then
// divisibility by the dilation), over the m output channels of its channel.  Gather form: no atomics.
template <typename T, typename I>
__global__ void depthwise_bwd_input_gather(const T* __restrict__ grad_out, const T* __restrict__ weight,
                                           T* __restrict__ grad_x, I images, int channels, int multiplier,
                                           int height, int width, int out_h, int out_w, int kernel_h,
                                           int kernel_w, int stride_h, int stride_w, int dilation_h,
                                           int dilation_w, int pad_top, int pad_left) {
  const int taps = kernel_h * kernel_w;
  const I total = images * channels * height * width;
  for (I index = grid_start<I>(); index < total; index += grid_stride<I>()) {
    const int ty = (int)(index / width % height) + pad_top;  // row in the padded input
    const int tx = (int)(index % width) + pad_left;
    const I plane = index / width / height;  // image * C + c
    const int c = (int)(plane % channels);
    const int low_y = ty - (kernel_h - 1) * dilation_h, low_x = tx - (kernel_w - 1) * dilation_w;
    const int oy_first = low_y <= 0 ? 0 : (low_y + stride_h - 1) / stride_h;
    const int ox_first = low_x <= 0 ? 0 : (low_x + stride_w - 1) / stride_w;
    const int oy_last = min(out_h - 1, ty / stride_h), ox_last = min(out_w - 1, tx / stride_w);
    acc_t<T> sum = 0;
    for (int k = 0; k < multiplier; ++k) {
      const int co = c * multiplier + k;
      const T* g = grad_out + ((plane / channels * channels + c) * multiplier + k) * (I)out_h * out_w;
      const T* w = weight + (I)co * taps;
      for (int oy = oy_first; oy <= oy_last; ++oy) {
        const int dy = ty - oy * stride_h;
        if (dy % dilation_h) continue;
        for (int ox = ox_first; ox <= ox_last; ++ox) {
          const int dx = tx - ox * stride_w;
          if (dx % dilation_w) continue;
          sum += to_acc(w[dy / dilation_h * kernel_w + dx / dilation_w]) * to_acc(g[(I)oy * out_w + ox]);
        }
      }
    }
    grad_x[index] = from_acc<T>(sum);
  }
}

// Weight (and bias) gradient without shared memory: one thread per weight element sums over every (image, output
// pixel) in a fixed order and writes it (taps, then biases when has_bias): one row, nothing to finish.
template <typename T, typename I>
__global__ void depthwise_bwd_weight_direct(const T* __restrict__ x, const T* __restrict__ grad_out,
                                            T* __restrict__ out, I images, int channels,
                                            int multiplier, int height, int width, int out_h, int out_w,
                                            int kernel_h, int kernel_w, int stride_h, int stride_w,
                                            int dilation_h, int dilation_w, int pad_top, int pad_left,
                                            int has_bias) {
  const int taps = kernel_h * kernel_w, out_channels = channels * multiplier;
  const I total = (I)out_channels * (taps + has_bias);
  for (I e = grid_start<I>(); e < total; e += grid_stride<I>()) {
    const bool is_bias = e >= (I)out_channels * taps;
    const int co = (int)(is_bias ? e - (I)out_channels * taps : e / taps);
    const int tap = is_bias ? 0 : (int)(e % taps);
    const int dy = tap / kernel_w * dilation_h - pad_top, dx = tap % kernel_w * dilation_w - pad_left;
    acc_t<T> sum = 0;
    for (I n = 0; n < images; ++n) {
      const T* g = grad_out + (n * out_channels + co) * (I)out_h * out_w;
      const T* src = x + (n * channels + co / multiplier) * (I)height * width;
      for (int oy = 0; oy < out_h; ++oy) {
        const int yy = oy * stride_h + dy;
        if (!is_bias && (yy < 0 || yy >= height)) continue;
        for (int ox = 0; ox < out_w; ++ox) {
          const int xx = ox * stride_w + dx;
          if (is_bias)
            sum += to_acc(g[(I)oy * out_w + ox]);
          else if (xx >= 0 && xx < width)
            sum += to_acc(g[(I)oy * out_w + ox]) * to_acc(src[(I)yy * width + xx]);
        }
      }
    }
    out[e] = from_acc<T>(sum);
  }
}
