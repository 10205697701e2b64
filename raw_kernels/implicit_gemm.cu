// Tensor-core implicit GEMMs: the forward, input gradient and weight gradient of conv2d (and of patch_conv2d,
// whose patches are the images of a batch view), for float16/bfloat16 inputs with float accumulators and
// float inputs as TF32.  Each pass is one GEMM per group, C (M x N) = A (M x K) * B (K x N), whose operands are
// gathered straight from the tensors (no column matrix exists anywhere); with tap = i * kW + j:
//
//   pass           M (rows)                  N        K (reduction)           A[m][k]              B[k][n]
//   forward        images * oH * oW pixels   D / G    (c, tap): C / G * taps  x at (m, c, tap)     weight[n][c][tap]
//   input grad     images * H * W pixels     C / G    (d, tap): D / G * taps  grad_out (m, d, tap)* weight[d][n][tap]
//   weight grad    (c, tap): C / G * taps    D / G    images * oH * oW pixels x at (k, c, tap)     grad_out[n][k]
//
//   * the output pixel ((y + pad_top - i * dilation_h) / stride_h, ...) when both divisions are exact and land
//     inside the output, else 0 (the transposed convolution, as a gather: no atomics).
//
// x is read through a batch view (image q at (q / x_inner) * x_stride_outer + (q % x_inner) * x_stride_inner,
// then c, h, w strides); grad_out is contiguous (images, D, oH, oW), like out and grad_x.  The forward adds bias
// and converts to T once, from the float accumulators; the weight gradient writes float sums per split of its
// reduction (grid.z), which the launcher adds up in a fixed order (the same bits on every run).  (The channels-last
// weight gradients at the end of this file finish their splits in the kernel: `wg_last_arrival`.)
//
// A block computes a BM x BN tile of C with BM / 32 x BN / 32 warps, each warp 32 x 32 = 2 x 4 mma tiles of
// 16 x 8, over K in chunks of TC_BK.  The chunks are staged in shared memory as T (as float for float inputs,
// rounded to tf32 as the fragments are read), rows TC_BK + pad apart so that the fragment reads of a warp hit
// 32 different banks.  Two stages: the global loads of chunk t + 1 are issued into registers before the tensor
// cores work on chunk t and stored to the other stage after, one barrier per chunk.  Each operand is loaded
// with the lanes of a warp either along its rows or along k, whichever runs along memory (`TcLoad`).
// The planner (cupyconv/ops/implicit_gemm.py `plan_tensor_cores`) picks BM x BN per problem from TC_TILES.
#include "common.cuh"
#include "gather.cuh"
#include "mma.cuh"

#if !defined(TC_MAX_THREADS)
#error "implicit_gemm.cu needs the -D options of cupyconv._device.compile_options('implicit_gemm.cu')"
#endif
constexpr int TC_BK = 32;

template <typename T> struct TcTile {  // 16-bit inputs: m16n8k16, rows padded by 8 elements (16 bytes)
  typedef T Stage;
  static constexpr int K_STEP = 16, PITCH = TC_BK + 8;
};
template <> struct TcTile<float> {  // float inputs on TF32: m16n8k8, rows padded by 4 floats
  typedef float Stage;
  static constexpr int K_STEP = 8, PITCH = TC_BK + 4;
};

// One K step of one warp: acc[mi][ni] += A rows (16 mi ..) x B columns (8 ni ..) of the warp's stage slices.
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

// Which elements of an R x TC_BK operand chunk a thread loads, the same for every chunk: ROW_SLOTS rows by
// K_SLOTS columns k, element (ks, rs) at (row(rs), k(ks)).  LANES_ON_ROWS: a warp reads one k of 32 consecutive
// rows (neighbouring pixels); otherwise a warp reads 32 consecutive k of one row (k runs along memory).  A gather
// decodes each of its k once per chunk and each of its rows once per kernel, then combines them per element.
template <int R, int THREADS, bool LANES_ON_ROWS> struct TcLoad {
  static constexpr int WARPS = THREADS / 32, ROW_SLOTS = R / 32, K_SLOTS = TC_BK / WARPS;
  static_assert(R % 32 == 0 && TC_BK % WARPS == 0, "rows in warps of 32, k in whole warps");
  __device__ static int row(int rs) { return (threadIdx.x & 31) + 32 * rs; }
  __device__ static int k(int ks) { return (threadIdx.x >> 5) + WARPS * ks; }
};
template <int R, int THREADS> struct TcLoad<R, THREADS, false> {
  static constexpr int WARPS = THREADS / 32, ROW_SLOTS = R / WARPS, K_SLOTS = 1;
  static_assert(R % WARPS == 0, "whole rows per warp");
  __device__ static int row(int rs) { return (threadIdx.x >> 5) + WARPS * rs; }
  __device__ static int k(int) { return threadIdx.x & 31; }
};

// Where row m = (image, pixel) of group g's C starts in an NCHW array (n, groups * N, pixels): the epilogue row
// of the forward (C = the output) and of the input gradient (C = grad_x); column n lies n * pixels further on.
template <typename I>
__device__ __forceinline__ I group_plane_row(I m, I pixels, int groups, int g, int N) {
  const I image = m / pixels;
  return (image * groups + g) * (I)N * pixels + (m - image * pixels);
}

// The GEMM of one block tile: rows m0.., columns n0.., k from k_begin to k_end (k_begin a multiple of TC_BK).
// `Gather` supplies the operands and takes the results:
//   typedefs LoadA, LoadB (TcLoad layouts), AColumn, BColumn; M, N;
//   AColumn a_column(I k), BColumn b_column(I k): what GEMM column k means for A or B (decoded once per chunk
//     and k slot, for all of the thread's rows);
//   S a(const AColumn&, int rs), S b(const BColumn&, int rs): the element at that column and the thread's row
//     slot rs (tile row LoadA::row(rs) / LoadB::row(rs)), 0 outside the problem (rows past M or N, k past K);
//   I out_row(I m), store(I row, int n, float value): where row m of C goes, and element (m, n) itself.
template <typename T, typename I, int BM, int BN, class Gather>
__device__ __forceinline__ void tc_block(const Gather& gather, typename TcTile<T>::Stage* as,
                                         typename TcTile<T>::Stage* bs, I m0, int n0, I k_begin, I k_end) {
  typedef typename TcTile<T>::Stage S;
  typedef typename Gather::LoadA LA;
  typedef typename Gather::LoadB LB;
  constexpr int P = TcTile<T>::PITCH;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp / (BN / 32) * 32, warp_n = warp % (BN / 32) * 32;

  S a_next[LA::K_SLOTS][LA::ROW_SLOTS], b_next[LB::K_SLOTS][LB::ROW_SLOTS];
  auto load_chunk = [&](I k0) {
#pragma unroll
    for (int ks = 0; ks < LA::K_SLOTS; ++ks) {
      const typename Gather::AColumn column = gather.a_column(k0 + LA::k(ks));
#pragma unroll
      for (int rs = 0; rs < LA::ROW_SLOTS; ++rs) a_next[ks][rs] = gather.a(column, rs);
    }
#pragma unroll
    for (int ks = 0; ks < LB::K_SLOTS; ++ks) {
      const typename Gather::BColumn column = gather.b_column(k0 + LB::k(ks));
#pragma unroll
      for (int rs = 0; rs < LB::ROW_SLOTS; ++rs) b_next[ks][rs] = gather.b(column, rs);
    }
  };
  auto store_chunk = [&](int stage) {
#pragma unroll
    for (int ks = 0; ks < LA::K_SLOTS; ++ks) {
#pragma unroll
      for (int rs = 0; rs < LA::ROW_SLOTS; ++rs) as[(stage * BM + LA::row(rs)) * P + LA::k(ks)] = a_next[ks][rs];
    }
#pragma unroll
    for (int ks = 0; ks < LB::K_SLOTS; ++ks) {
#pragma unroll
      for (int rs = 0; rs < LB::ROW_SLOTS; ++rs) bs[(stage * BN + LB::row(rs)) * P + LB::k(ks)] = b_next[ks][rs];
    }
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

  const I chunks = k_end > k_begin ? (k_end - k_begin + TC_BK - 1) / TC_BK : 0;  // uniform across the block
  if (chunks > 0) {
    load_chunk(k_begin);
    store_chunk(0);
  }
  __syncthreads();
  for (I t = 0; t < chunks; ++t) {
    const int stage = (int)(t & 1);
    if (t + 1 < chunks) load_chunk(k_begin + (t + 1) * TC_BK);  // in flight while the tensor cores work on t
    const S* a_stage = as + (stage * BM + warp_m) * P;
    const S* b_stage = bs + (stage * BN + warp_n) * P;
#pragma unroll
    for (int k0 = 0; k0 < TC_BK; k0 += TcTile<T>::K_STEP) tc_warp_step<S>(a_stage, b_stage, k0, lane, acc);
    if (t + 1 < chunks) store_chunk(stage ^ 1);  // the other stage: last read before the previous barrier
    __syncthreads();
  }

  // Epilogue: accumulator (row lane / 4 (+8), columns 2 (lane % 4) (+1)) of each mma tile, one rounding.
  const int gq = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const I m = m0 + warp_m + mi * 16 + gq + 8 * half;
      if (m >= gather.M) continue;
      const I row = gather.out_row(m);
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int n = n0 + warp_n + ni * 8 + 2 * q + j;
          if (n < gather.N) gather.store(row, n, acc[mi][ni][2 * half + j]);
        }
      }
    }
  }
}

// Forward: A = x gathered per output pixel (lanes on pixels), B = the weight rows (lanes on k).
template <typename T, typename I, int BM, int BN> struct TcForward {
  typedef typename TcTile<T>::Stage S;
  typedef TcLoad<BM, BM * BN / 32, true> LoadA;
  typedef TcLoad<BN, BM * BN / 32, false> LoadB;
  const T* x; const T* weight; const T* bias; T* out;
  I M, pixels, x_stride_c, x_stride_h, x_stride_w;
  int N, K, g, n0, dilation_h, dilation_w, height, width, groups, has_bias;
  FastDivmod taps, kernel_w;
  typedef typename Unsigned<I>::type U;
  U row_origin[LoadA::ROW_SLOTS];  // this thread's output pixels: where their top-left tap lies in x,
  int row_y[LoadA::ROW_SLOTS], row_x[LoadA::ROW_SLOTS];  // and its input position

  struct AColumn { WindowTap<I> tap; bool inside; };  // k = (c, i, j)
  struct BColumn { I k; bool inside; };
  __device__ AColumn a_column(I k) const {
    return {decode_tap<I>((int)k, taps, kernel_w, dilation_h, dilation_w, x_stride_c, x_stride_h, x_stride_w),
            k < K};
  }
  __device__ S a(const AColumn& column, int rs) const {
    const int y = row_y[rs] + column.tap.dy, xx = row_x[rs] + column.tap.dx;  // unsigned compares: also false below 0
    if (!column.inside || (unsigned)y >= (unsigned)height || (unsigned)xx >= (unsigned)width) return S(0.0f);
    return S(x[(I)(row_origin[rs] + column.tap.offset)]);
  }
  __device__ BColumn b_column(I k) const { return {k, k < K}; }
  __device__ S b(const BColumn& column, int rs) const {
    const int n = n0 + LoadB::row(rs);
    return n < N && column.inside ? S(weight[(I)(g * N + n) * K + column.k]) : S(0.0f);
  }
  __device__ I out_row(I m) const { return group_plane_row(m, pixels, groups, g, N); }
  __device__ void store(I row, int n, float value) const {
    if (has_bias) value += to_acc(bias[g * N + n]);
    out[row + (I)n * pixels] = from_acc<T>(value);
  }
};

template <typename T, typename I, int BM, int BN>
__global__ void __launch_bounds__(TC_MAX_THREADS) conv_fwd_tc(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    I x_inner, I x_stride_outer, I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
    int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w, int stride_h,
    int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w, int has_bias) {
  typedef typename TcTile<T>::Stage S;
  constexpr int P = TcTile<T>::PITCH;
  __shared__ __align__(16) S as[2 * BM * P];  // [stage][row][k]
  __shared__ __align__(16) S bs[2 * BN * P];
  TcForward<T, I, BM, BN> f;
  const int n_tiles = (outputs_per_group + BN - 1) / BN;
  f.x = x; f.weight = weight; f.bias = bias; f.out = out;
  f.pixels = (I)out_h * out_w; f.M = n * f.pixels; f.N = outputs_per_group;
  f.taps = FastDivmod(kernel_h * kernel_w); f.K = channels_per_group * kernel_h * kernel_w;
  f.kernel_w = FastDivmod(kernel_w);
  f.x_stride_c = x_stride_c; f.x_stride_h = x_stride_h; f.x_stride_w = x_stride_w;
  f.dilation_h = dilation_h; f.dilation_w = dilation_w; f.height = height; f.width = width;
  f.groups = groups; f.has_bias = has_bias;
  f.g = blockIdx.y / n_tiles; f.n0 = blockIdx.y % n_tiles * BN;
  const I m0 = (I)blockIdx.x * BM;
  const BatchView<I> view = {x_inner, x_stride_outer, x_stride_inner};
#pragma unroll
  for (int r = 0; r < TcForward<T, I, BM, BN>::LoadA::ROW_SLOTS; ++r) {
    const WindowRow<I> row = window_row<I>(m0 + (threadIdx.x & 31) + 32 * r, f.M, f.pixels, view,
                                           (I)(f.g * channels_per_group) * x_stride_c, out_w, stride_h, stride_w,
                                           pad_top, pad_left, x_stride_h, x_stride_w);
    f.row_origin[r] = row.origin; f.row_y[r] = row.y; f.row_x[r] = row.x;
  }
  tc_block<T, I, BM, BN>(f, as, bs, m0, f.n0, (I)0, (I)f.K);
}

// Input gradient: A = grad_out gathered per input pixel through the transposed window (lanes on pixels),
// B = the weight read across its output channels (lanes on k = (d, tap)).
template <typename T, typename I, int BM, int BN> struct TcInputGrad {
  typedef typename TcTile<T>::Stage S;
  typedef TcLoad<BM, BM * BN / 32, true> LoadA;
  typedef TcLoad<BN, BM * BN / 32, false> LoadB;
  const T* grad_out; const T* weight; T* grad_x;
  I M, pixels, out_pixels;
  int N, K, g, n0, groups, outputs_per_group, dilation_h, dilation_w, out_h, out_w;
  FastDivmod taps, kernel_w, stride_h, stride_w;
  I row_base[LoadA::ROW_SLOTS];  // where this thread's input pixels' image and group start in grad_out,
  int row_y[LoadA::ROW_SLOTS], row_x[LoadA::ROW_SLOTS];  // and their position plus the padding

  struct AColumn { int d, dy, dx; bool inside; };  // k = (d, i, j): the channel and the tap's offsets
  struct BColumn { I offset; bool inside; };              // where weight[g's d][c = 0][tap] lies
  __device__ AColumn a_column(I k) const {
    AColumn column = {0, 0, 0, k < K};
    int tap, j;
    const int d = taps.divmod((int)k, tap), i = kernel_w.divmod(tap, j);
    if (column.inside) column = {d, i * dilation_h, j * dilation_w, true};
    return column;
  }
  __device__ S a(const AColumn& column, int rs) const {
    int ry, rx;
    const int ty = row_y[rs] - column.dy, tx = row_x[rs] - column.dx;
    const int oy = stride_h.divmod(max(ty, 0), ry), ox = stride_w.divmod(max(tx, 0), rx);  // (divmod needs n >= 0)
    if (!column.inside || ty < 0 || tx < 0 || ry != 0 || rx != 0 || oy >= out_h || ox >= out_w) return S(0.0f);
    return S(grad_out[row_base[rs] + (I)column.d * out_pixels + oy * out_w + ox]);
  }
  __device__ BColumn b_column(I k) const {
    int tap;
    const int d = taps.divmod((int)k, tap);
    return {k < K ? (I)(g * outputs_per_group + d) * N * taps.d + tap : (I)0, k < K};
  }
  __device__ S b(const BColumn& column, int rs) const {
    const int c = n0 + LoadB::row(rs);
    return c < N && column.inside ? S(weight[column.offset + (I)c * taps.d]) : S(0.0f);
  }
  __device__ I out_row(I m) const { return group_plane_row(m, pixels, groups, g, N); }
  __device__ void store(I row, int n, float value) const { grad_x[row + (I)n * pixels] = from_acc<T>(value); }
};

template <typename T, typename I, int BM, int BN>
__global__ void __launch_bounds__(TC_MAX_THREADS) conv_bwd_input_tc(
    const T* __restrict__ grad_out, const T* __restrict__ weight, T* __restrict__ grad_x, I n, int groups,
    int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w, int stride_h,
    int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w) {
  typedef typename TcTile<T>::Stage S;
  constexpr int P = TcTile<T>::PITCH;
  __shared__ __align__(16) S as[2 * BM * P];
  __shared__ __align__(16) S bs[2 * BN * P];
  TcInputGrad<T, I, BM, BN> f;
  const int n_tiles = (channels_per_group + BN - 1) / BN;
  f.grad_out = grad_out; f.weight = weight; f.grad_x = grad_x;
  f.pixels = (I)height * width; f.M = n * f.pixels; f.out_pixels = (I)out_h * out_w;
  f.N = channels_per_group; f.taps = FastDivmod(kernel_h * kernel_w); f.K = outputs_per_group * kernel_h * kernel_w;
  f.groups = groups; f.outputs_per_group = outputs_per_group; f.kernel_w = FastDivmod(kernel_w);
  f.stride_h = FastDivmod(stride_h); f.stride_w = FastDivmod(stride_w); f.dilation_h = dilation_h; f.dilation_w = dilation_w;
  f.out_h = out_h; f.out_w = out_w;
  f.g = blockIdx.y / n_tiles; f.n0 = blockIdx.y % n_tiles * BN;
  const I m0 = (I)blockIdx.x * BM;
#pragma unroll
  for (int r = 0; r < TcInputGrad<T, I, BM, BN>::LoadA::ROW_SLOTS; ++r) {
    const I m = m0 + (threadIdx.x & 31) + 32 * r;
    f.row_y[r] = -(1 << 30);  // rows past M read nothing: every ty is negative (the reach is below 2^30)
    f.row_x[r] = 0;
    f.row_base[r] = 0;
    if (m < f.M) {
      const I image = m / f.pixels;
      const int p = (int)(m - image * f.pixels);
      f.row_y[r] = p / width + pad_top;
      f.row_x[r] = p % width + pad_left;
      f.row_base[r] = (image * groups + f.g) * (I)outputs_per_group * f.out_pixels;
    }
  }
  tc_block<T, I, BM, BN>(f, as, bs, m0, f.n0, (I)0, (I)f.K);
}

// =================================================================================================================
// Forward and input gradient, channels-last (issue 24): the fast path
// =================================================================================================================
//
// The same GEMM as conv_fwd_tc (rows = output pixels, columns = output channels of group g), with K ordered
// (tap, channel) over a channels-last (NHWC) x, so that a thread's 16 bytes of consecutive channels (8 of a
// 16-bit type, 4 floats) are one cp.async.  Its operands:
//
//   x       (n, H, W, C) contiguous (`channels_last` below made it from NCHW, or the caller's array in place);
//   weight  (D, taps, C / G) contiguous: B[k = (tap, c)][n] = weight[g * D / G + n][tap][c], arranged once per
//           call (ops/implicit_gemm.py `arrange_weight`);
//   out     (n, D, oH, oW) contiguous (NCHW), or with channels_last_out (n, oH, oW, D) contiguous (the caller's
//           x was channels-last: its output is too, as torch's; D / G whole vectors, out 16-byte aligned); bias
//           (D,) added in float before the one rounding.
//
// The input gradient at stride 1 is this very kernel on channels_last(grad_out) with the transposed window
// (ops/conv.py `transposed_spec`) and the weight arranged as (C, flipped taps, D / G); at stride > 1 each phase of
// grad_input's pixels (ops/implicit_gemm.py `grad_input_phases`) is a stride-1 GEMM whose epilogue writes its
// pixels straight into their places in the NCHW grad_input (out_plane != pixels: `ig_phase_pixel`, 16-byte stores
// where vector_store says the phase's rows allow them, scalar ones otherwise): all the phases in ONE launch of
// conv_fwd_igemm_phases (the same body, `_grad_input_one_launch`: blockIdx.z picks split and phase, `ig_axis_phase`
// the phase's geometry from the strided window's) where every phase with taps takes the same taps per axis, else
// one launch of conv_fwd_igemm per phase.
//
// Requirements, checked by the planner (`igemm_refusal`): C / G and D / G multiples of IG_VECTOR_BYTES / sizeof
// (T), so that no 16-byte vector straddles a tap or a group; x and the weight 16-byte aligned.
//
// Block: IG_THREADS = 4 warps in 2 x 2, each a (BM / 2) x (BN / 2) warp tile of m16n8 mma tiles (256 x 64 and the
// 32-column tiles of small groups: 4 x 1 warps of (BM / 4) x BN), over K in chunks of IG_ROW_BYTES bytes (32 halves or 16 floats: two mma k-steps).  Shared memory holds STAGES chunks
// of A (BM rows) and B (BN rows), each row IG_ROW_BYTES = 4 vectors of 16 bytes; vector v of row r is stored
// at position v ^ ((r >> 1) & 3), so that the 8 rows an ldmatrix phase reads (and the 8 vectors a quarter warp
// of cp.async writes) fall in 8 different 16-byte bank groups: no bank conflicts without padding.
// Pipeline: chunks t + 1 .. t + STAGES - 1 are in flight (cp.async, one commit group per chunk) while the
// tensor cores work on chunk t; one wait + barrier per chunk, after which the stage read in the previous chunk is
// refilled.  conv_fwd_igemm's tiles (IG_PAIRS, ig_forward's PAIRS; 256 rows with 32-bit indices only, their rows'
// y and x packed in halves of one register: PACKED) load two chunks into two
// neighbouring stages at once, 8 lanes a row reading 128 bytes of it (whole lines: half the L1 wavefronts of the
// global side), with one commit group, wait and barrier per pair.  Epilogue: the accumulators (+ bias, rounded once to T) go through shared memory transposed to
// (column, row), from where each thread stores 16 bytes of 8 (or 4) consecutive output pixels of one channel;
// channels-last (`ig_store_channels_last`), untransposed, 16 bytes of consecutive channels of one pixel.
// Split-K (grids under a wave, `plan_igemm`): block z reduces chunks_per_split chunks of K from chunk z *
// chunks_per_split on and writes its float sums to partial (splits, out's shape and layout), the bias in split 0's; then
// conv_bwd_weight_igemm_finish (taps 1: no permutation) adds the splits in order and rounds once into out.  The
// number of splits depends on the shapes only, so the bits are the same on every run and GPU.
#include "async_copy.cuh"

#if !defined(IG_THREADS) || !defined(IG_ROW_BYTES) || !defined(IG_PAIRS)
#error "implicit_gemm.cu needs the -D options of cupyconv._device.compile_options('implicit_gemm.cu')"
#endif
constexpr int IG_VECTOR_BYTES = 16;
constexpr int IG_ROW_VECTORS = IG_ROW_BYTES / IG_VECTOR_BYTES;  // 4: the swizzle below assumes it
static_assert(IG_ROW_VECTORS == 4 && IG_THREADS == 128, "4 vectors of 16 bytes per row, 4 warps per block");
extern __shared__ __align__(16) unsigned char igemm_shared[];

// The mma of one k-step of 16 bytes x 2 vectors (16 halves or 8 floats): the one place T picks the instruction.
template <typename T>
__device__ __forceinline__ void ig_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  mma_m16n8k16<T>(d, a, b);
}
template <>
__device__ __forceinline__ void ig_mma<float>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  mma_m16n8k8_tf32(d, a, b);  // the operands were rounded to tf32 once, when staged (`channels_last_copy`)
}

// Byte offset of vector v of staged row r: the XOR swizzle.
__device__ __forceinline__ int ig_swizzle(int r, int v) { return r * IG_ROW_BYTES + ((v ^ ((r >> 1) & 3)) << 4); }

// Makes the compiler treat the values as unknown from here on, so that it keeps them in registers instead of
// recomputing them (rematerialising) where they are used.  No instruction.  The emulator: nothing to do.
template <int N> __device__ __forceinline__ void ig_keep_in_register(int (&values)[N]) {
#ifndef __CUPYCONV_EMULATOR__
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(values[i]));
#endif
}

// The channels-last epilogue (out (n, oH, oW, D) contiguous): tile[row][column] = T(acc + bias) in the (drained)
// pipeline's shared memory, then 16-byte stores of VEC consecutive channels of one output pixel, a row's
// vectors on consecutive lanes (coalesced along the pixel's channels).  Rows are BN + 8 elements apart: the
// pair stores of a warp (8 rows x 4 column pairs; float's in two half-warp phases) hit 32 different banks.
// Only with vector stores: D / G a multiple of VEC and out 16-byte aligned, so that a vector never straddles a
// group (the planner, `forward_output`, asks for NCHW otherwise; a scalar fallback here cost the 128 x 64 main
// loop 14 instructions of its register allocation, NVRTC 13).
template <typename T, typename I, int BM, int BN, int MI, int NI, int WARPS_N>
__device__ __forceinline__ void ig_store_channels_last(const float (&acc)[MI][NI][4], const T* bias, T* out,
                                                       int has_bias, I m0, I M, int g, int dg, int channels,
                                                       int n0) {
  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T), PITCH = (BN + 8) * (int)sizeof(T);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, qq = lane & 3;
  const int warp_m = warp / WARPS_N * (BM / (4 / WARPS_N)), warp_n = warp % WARPS_N * (BN / WARPS_N);
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    const int col = warp_n + ni * 8 + 2 * qq, n = n0 + col;
    const float add0 = has_bias && n < dg ? to_acc(bias[g * dg + n]) : 0.0f;
    const float add1 = has_bias && n + 1 < dg ? to_acc(bias[g * dg + n + 1]) : 0.0f;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_m + mi * 16 + gq + 8 * h;
        store_pair<T>(igemm_shared + row * PITCH + col * (int)sizeof(T), acc[mi][ni][2 * h] + add0,
                         acc[mi][ni][2 * h + 1] + add1);
      }
    }
  }
  __syncthreads();
  // Thread: vector cv of rows tid / COLUMN_VECTORS + k ROW_STEP.
  constexpr int COLUMN_VECTORS = BN / VEC, ROW_STEP = IG_THREADS / COLUMN_VECTORS;
  static_assert(IG_THREADS % COLUMN_VECTORS == 0, "whole rows per pass");
  const int cv = tid % COLUMN_VECTORS, n = n0 + cv * VEC;
  if (n >= dg) return;
  for (int row = tid / COLUMN_VECTORS; row < BM; row += ROW_STEP) {
    const I m = m0 + row;
    if (m >= M) break;
    const unsigned char* src = igemm_shared + row * PITCH + cv * IG_VECTOR_BYTES;
    T* dst = out + m * channels + (I)g * dg + n;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
}

// Where pixel p of a phase of the strided input gradient (ops/implicit_gemm.py `grad_input_phases`; its rows of
// width pixels) lies in a plane of grad_input: first + row * row_step + column * column_step (the phase's first
// pixel, s_h * W and s_w).  The epilogue of conv_fwd_igemm and the final pass of its split sums write there
// directly, so that no phase goes through a buffer and a copy.
template <typename I>
__device__ __forceinline__ I ig_phase_pixel(I p, int width, I first, I row_step, int column_step) {
  const I row = p / width;
  return first + row * row_step + (p - row * width) * column_step;
}

// Phase `first` of one axis of the strided input gradient run as one launch (ops/implicit_gemm.py `axis_phases`,
// where every phase with taps has the same `taps`, the kernel a multiple of step = stride / gcd(stride, dilation)):
// its rows of grad_input, its stride-1 convolution's padding above, and where its taps lie in the phase-major
// weight (`_grad_input_one_launch`: residue step - 1 - i0 of the flipped taps; -1: the phase has no tap).
struct IgAxisPhase {
  int rows, pad, residue;
};
__device__ __forceinline__ IgAxisPhase ig_axis_phase(int first, int size, int stride, int dilation, int pad, int step,
                                                     int taps, int phase_dilation) {
  IgAxisPhase phase = {(size - first + stride - 1) / stride, 0, -1};
  for (int i = 0; i < step; ++i) {  // the first tap i0 of the phase: (first + pad - i0 dilation) % stride == 0
    const int reach = first + pad - i * dilation;
    if (reach % stride == 0) {
      phase.pad = (taps - 1) * phase_dilation - reach / stride;
      phase.residue = step - 1 - i;
      break;
    }
  }
  return phase;
}

// The body of conv_fwd_igemm (PHASES false) and conv_fwd_igemm_phases (PHASES true: all the phases of a strided
// input gradient in one launch).  The phase code is compiled out of conv_fwd_igemm (`if constexpr`), so that every
// other launch runs the code it ran before the phases came into one launch: the performance model charged their
// run-time branches some 580 static instructions and 3-8% more executed ones to every forward.
// DEPTH (conv_fwd_igemm_3d): a 3-D window, x (n, depth, H, W, C) and out (n, D, out_d, oH, oW) or channels-last;
// each A row keeps its window's front depth z beside y and x, the tap carry goes c -> s -> r -> q (depth tap), and
// a depth in the padding is zero-filled like a row.  Compiled out of the 2-D kernels (`if constexpr`, and IgDepth
// empty there), whose SASS stays as it was.
// Whether a row's depth tap lies in x is one bit of a register made once (bit q * A_ROWS + i: row i, tap q; the
// planner keeps A_ROWS * kernel_d <= 32, `IG_3D_TILES`), whose A_ROWS bits of the current tap the carry into q
// shifts down: the loader's test per chunk and row is one bit more than the 2-D one, and the thread keeps three
// registers more, so that the 256 x 64 tile fits too.
template <int A_ROWS, bool DEPTH> struct IgDepth {  // the depth axis of the thread's A rows and of its tap carry
  unsigned inside;  // bit q * A_ROWS + i: row i's depth tap q lies inside x (not in the padding)
  unsigned rows;    // the current tap's A_ROWS bits of inside (none past the last tap)
  int q;            // the column's depth tap
};
template <int A_ROWS> struct IgDepth<A_ROWS, false> {};
template <typename T, typename I, int BM, int BN, int STAGES, bool PHASES, bool DEPTH = false>
__device__ __forceinline__ void ig_forward(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    int groups, int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w,
    int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w,
    int has_bias, int vector_store, int channels_last_out, float* __restrict__ partial, int chunks_per_split,
    I out_plane, I phase_first, I phase_row_step, int phase_column_step, int phases_h, int phases_w,
    int grad_stride_h, int grad_stride_w, int grad_dilation_h, int grad_dilation_w, int grad_pad_top,
    int grad_pad_left, int grad_step_h, int grad_step_w, int grad_height, int grad_width, I phase_weight_size,
    int depth = 1, int out_d = 1, int kernel_d = 1, int stride_d = 1, int dilation_d = 1, int pad_front = 0) {
  typedef typename Unsigned<I>::type U;
  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T);  // elements per vector
  constexpr int BK = IG_ROW_VECTORS * VEC;                // elements of K per chunk
  // PAIRS: one load fills two chunks (two neighbouring stages), 128 bytes of K per row and 8 lanes a row, so that
  // a warp's cp.async reads 4 whole 128-byte lines instead of 8 half ones (fewer L1 wavefronts per HMMA); each
  // thread then copies twice the rows.  The 2-D kernels' tiles; 256 rows with 32-bit indices only (PACKED below:
  // with 64-bit ones, 16 rows' bases of two registers would spill).
  constexpr bool PAIRS = IG_PAIRS && !PHASES && !DEPTH && STAGES % 2 == 0 && (BM <= 128 || sizeof(I) == 4);
  // PACKED (the 256-row tile's pairs: 16 A rows a thread): a row's window origin y, x as the 16-bit halves of one
  // register, ((y << 16) + x + 2^15), so that the rows fit in registers without spills.  One add of the tap's
  // (dy << 16) + dx gives both coordinates at once, and each test stays one compare (as y + dy and x + dx do):
  // the planner keeps every y + dy, x + dx within (-2^14, 2^15) and the image within 2^14 (`ig_fits_halves`), so
  // the low half never carries into the high one.
  constexpr bool PACKED = PAIRS && BM > 128;
  constexpr int STEP = PAIRS ? 2 : 1;                              // chunks per load
  constexpr int ROWS_PER_PASS = IG_THREADS / (IG_ROW_VECTORS * STEP);  // rows the block copies per vector
  constexpr int A_ROWS = BM / ROWS_PER_PASS, B_ROWS = BN / ROWS_PER_PASS;
  // Warps: 2 x 2 of (BM / 2) x (BN / 2), or 4 x 1 of (BM / 4) x BN for 256 x 64 (the square warp tile: the fewest
  // ldmatrix per mma.sync) and the narrow tiles of 32 columns (groups of at most 32 channels).
  constexpr int WARPS_N = BM >= 4 * BN ? 1 : 2, WARPS_M = 4 / WARPS_N;
  constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MI = WM / 16, NI = WN / 8;
  constexpr int STAGE_BYTES = (BM + BN) * IG_ROW_BYTES;
  static_assert(A_ROWS >= 1 && B_ROWS >= 1 && WM % 16 == 0 && WN % 16 == 0, "tile shape");

  // All phases of the strided input gradient in one launch (PHASES): blockIdx.z = split * phases + phase.
  // The block's phase replaces the window's padding and output size (the phase's rows and columns), its pixels'
  // place in grad_input and its slice of the phase-major weight; a phase without taps reduces nothing and writes
  // its zeros all the same (no fill elsewhere).  The grid's rows cover the largest phase, (0, 0).
  int split = (int)blockIdx.z, splits = (int)gridDim.z;
  bool has_taps = true;
  if constexpr (PHASES) {
    const int phases = phases_h * phases_w, phase = split % phases, fh = phase / phases_w, fw = phase % phases_w;
    split /= phases;
    splits /= phases;
    const IgAxisPhase ph = ig_axis_phase(fh, grad_height, grad_stride_h, grad_dilation_h, grad_pad_top, grad_step_h,
                                         kernel_h, dilation_h);
    const IgAxisPhase pw = ig_axis_phase(fw, grad_width, grad_stride_w, grad_dilation_w, grad_pad_left, grad_step_w,
                                         kernel_w, dilation_w);
    out_h = ph.rows;
    out_w = pw.rows;
    pad_top = ph.pad;
    pad_left = pw.pad;
    phase_first = (I)fh * grad_width + fw;
    has_taps = ph.residue >= 0 && pw.residue >= 0;
    if (has_taps) weight += (I)(ph.residue * grad_step_w + pw.residue) * phase_weight_size;
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cg = channels_per_group, dg = outputs_per_group, channels = groups * cg;
  const int n_tiles = (dg + BN - 1) / BN, g = blockIdx.y / n_tiles, n0 = blockIdx.y % n_tiles * BN;
  if constexpr (DEPTH) out_h *= out_d;  // the GEMM's rows: an image's (oz, oy) as one axis of out_d * out_h rows
  const I pixels = (I)out_h * out_w, M = n * pixels, m0 = (I)blockIdx.x * BM;
  if constexpr (PHASES) {
    if (m0 >= M) return;  // (a smaller phase's rows end before the grid's)
  }
  int K = has_taps ? kernel_h * kernel_w * cg : 0;
  if constexpr (DEPTH) K *= kernel_d;

  // --- what this thread copies: vector v of A rows tid / 4 + 32 i and of B rows tid / 4 + 32 i ---------------
  // PAIRS: vector v of chunk `half` of rows row0 + 16 i; a quarter warp (whose 16-byte stores share a wavefront)
  // writes rows row0, row0 + 1 of one stage, 8 different bank groups as above
  const int v = tid & 3, half = PAIRS ? (tid >> 3) & 1 : 0;
  const int row0 = PAIRS ? (tid >> 4) * 2 + ((tid >> 2) & 1) : tid >> 2;
  const int store_offset = ig_swizzle(row0, v) + half * STAGE_BYTES;  // + 32 i (16 i) rows: the same swizzle
  U a_base[A_ROWS];
  int a_y[A_ROWS], a_x[A_ROWS];
  unsigned a_yx[PACKED ? A_ROWS : 1];  // PACKED: a_y, a_x as halves (a_y and a_x themselves then go unused)
  IgDepth<A_ROWS, DEPTH> d3;
  if constexpr (DEPTH) {
    d3.inside = 0;
    d3.q = 0;
  }
#pragma unroll
  for (int i = 0; i < A_ROWS; ++i) {
    const I m = m0 + row0 + ROWS_PER_PASS * i;
    a_y[i] = -(1 << 30);  // rows past M read nothing: every y is out of range (the reach is below 2^30)
    a_x[i] = 0;
    a_base[i] = 0;
    if (m < M) {
      const I image = m / pixels;
      const int p = (int)(m - image * pixels), oy = p / out_w, ox = p - oy * out_w;
      a_y[i] = oy * stride_h - pad_top;
      a_x[i] = ox * stride_w - pad_left;
      if constexpr (DEPTH) {  // oy counts (oz, oy) of the plane out_h / out_d rows high: the window's front depth z
        const int plane_rows = out_h / out_d, oz = oy / plane_rows, z = oz * stride_d - pad_front;
        a_y[i] = (oy - oz * plane_rows) * stride_h - pad_top;
        a_base[i] = (U)(image * depth * height * width * channels + (I)g * cg) +
                    (((U)z * (U)height + (U)a_y[i]) * (U)width + (U)a_x[i]) * (U)channels;
        for (int t = 0; t < kernel_d; ++t) {
          if ((unsigned)(z + t * dilation_d) < (unsigned)depth) d3.inside |= 1u << (t * A_ROWS + i);
        }
        continue;
      }
      a_base[i] = (U)(image * height * width * channels + (I)g * cg) +
                  ((U)a_y[i] * (U)width + (U)a_x[i]) * (U)channels;
    }
    // rows past M: y = -2^15, below 0 for every tap (dy < 2^15)
    if constexpr (PACKED) a_yx[i] = m < M ? ((unsigned)a_y[i] << 16) + (unsigned)(a_x[i] + 0x8000) : 0x80008000u;
  }
  // The thread's column of A: channel c of tap (r, s), at tap_offset from a window's origin; advanced by
  // increments, chunk by chunk (no division): c grows by BK and carries into s, then r (DEPTH: then q).
  int c = v * VEC + half * BK, r = 0, s = 0, dy = 0, dx = 0;
  U tap_offset = (U)c;
  const U step_s = (U)dilation_w * (U)channels - (U)cg;                                       // s + 1, c - cg
  const U step_r = (U)dilation_h * (U)width * (U)channels - (U)kernel_w * (U)dilation_w * (U)channels;  // r + 1, s = 0
  auto carry = [&]() {
    while (c >= cg) {  // at most one pass when cg >= STEP * BK
      c -= cg;
      tap_offset += step_s;
      dx += dilation_w;
      if (++s == kernel_w) {
        s = 0;
        dx = 0;
        ++r;
        dy += dilation_h;
        tap_offset += step_r;
        if constexpr (DEPTH) {
          if (r == kernel_h) {  // q + 1, r = 0
            r = 0;
            dy = 0;
            ++d3.q;
            tap_offset += ((U)dilation_d * (U)height - (U)kernel_h * (U)dilation_h) * (U)width * (U)channels;
            d3.rows = d3.q < kernel_d ? (d3.inside >> (d3.q * A_ROWS)) & ((1u << A_ROWS) - 1) : 0u;
          }
        }
      }
    }
  };
  // Split-K: block z reduces chunks [z * chunks_per_split, ...) of K; its column of A and B starts that far on.
  const int all_chunks = (K + BK - 1) / BK, chunk_begin = split * chunks_per_split;
  const int chunks = all_chunks - chunk_begin < chunks_per_split ? all_chunks - chunk_begin : chunks_per_split;
  c += chunk_begin * BK;
  tap_offset += (U)(chunk_begin * BK);
  if constexpr (DEPTH) d3.rows = d3.inside & ((1u << A_ROWS) - 1);  // tap 0's (the carry moves it on)
  carry();  // v * VEC (and the split's start) may already be past a group of channels
  I b_offset[B_ROWS];
  bool b_inside[B_ROWS];
#pragma unroll
  for (int i = 0; i < B_ROWS; ++i) {
    const int col = n0 + row0 + ROWS_PER_PASS * i;
    b_inside[i] = col < dg;
    b_offset[i] = b_inside[i] ? (I)(g * dg + col) * K + v * VEC + half * BK + chunk_begin * BK : (I)0;
  }
  int b_k = v * VEC + half * BK + chunk_begin * BK;

  auto load_chunk = [&](int stage) {  // the thread's vectors of the next chunk (PAIRS: chunks, from stage on), then
                                      // advance to the one after
    unsigned char* a_stage = igemm_shared + stage * STAGE_BYTES;
    unsigned char* b_stage = a_stage + BM * IG_ROW_BYTES;
    const bool k_inside = r < kernel_h;
    const unsigned dyx = ((unsigned)dy << 16) + (unsigned)dx;  // PACKED: the tap's offset in the same halves
#pragma unroll
    for (int i = 0; i < A_ROWS; ++i) {
      bool tap_inside = k_inside;
      if constexpr (DEPTH) tap_inside = d3.rows & 1u << i;  // its depth tap's bit (r < kernel_h always: q carries)
      bool inside;
      if constexpr (PACKED) {  // yx = ((y + dy) << 16) + x + dx + 2^15, the low half in [0, 2^16): y + dy in
                               // [0, height) as yx < height << 16 (a negative one wraps above it); x + dx in [0,
                               // width) as the low half shifted up, signed, below -2^31 + (width << 16)
        const unsigned yx = a_yx[i] + dyx;
        inside = tap_inside && yx < (unsigned)height << 16 &&
                 (int)(yx << 16) < (int)(0x80000000u + ((unsigned)width << 16));
      } else {
        inside = tap_inside && (unsigned)(a_y[i] + dy) < (unsigned)height &&
                 (unsigned)(a_x[i] + dx) < (unsigned)width;
      }
      const T* src = inside ? x + (I)(a_base[i] + tap_offset) : x;  // padding: zero-fill, x itself not read
      cp_async_cg_16(a_stage + store_offset + ROWS_PER_PASS * i * IG_ROW_BYTES, src, inside ? IG_VECTOR_BYTES : 0);
    }
#pragma unroll
    for (int i = 0; i < B_ROWS; ++i) {
      const bool inside = b_inside[i] && b_k < K;
      cp_async_cg_16(b_stage + store_offset + ROWS_PER_PASS * i * IG_ROW_BYTES,
                     inside ? weight + b_offset[i] : weight, inside ? IG_VECTOR_BYTES : 0);
      b_offset[i] += STEP * BK;
    }
    b_k += STEP * BK;
    c += STEP * BK;
    tap_offset += STEP * BK;
    carry();
  };

  // --- fragments: the row addresses this lane gives ldmatrix (matrix j = lane / 8, its row lane % 8) ----------
  const int warp_m = warp / WARPS_N * WM, warp_n = warp % WARPS_N * WN, j = lane >> 3, jr = lane & 7;
  int a_frag[2], b_frag[2];  // per k-step: byte offsets in a stage of the warp's first mma tile
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    // A: matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15, k hi) = a[0..3]
    a_frag[ks] = ig_swizzle(warp_m + (j & 1) * 8 + jr, 2 * ks + (j >> 1));
    // B (n-major rows): (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi) = b of two n tiles
    b_frag[ks] = BM * IG_ROW_BYTES + ig_swizzle(warp_n + (j >> 1) * 8 + jr, 2 * ks + (j & 1));
  }
  // Kept in registers, not recomputed from threadIdx in every trip of the loop: NVRTC 13 did that (about 20
  // instructions a trip) for the 64 x 64 warp tiles, whose accumulators fill the register file.
  ig_keep_in_register(a_frag);
  ig_keep_in_register(b_frag);

  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
    }
  }

  // --- the pipeline (over this split's chunks) --------------------------------------------------------------
  // PAIRS: the same over pairs of chunks (STEP 2), one commit group, wait and barrier per pair; the second chunk
  // of a split's last pair is loaded but not reduced when chunks is odd, so the sums are the same either way.
#pragma unroll
  for (int t = 0; t < STAGES - STEP; t += STEP) {
    if (t < chunks) load_chunk(t);
    cp_async_commit();  // empty groups too: the count of groups in flight stays STAGES / STEP - 1
  }
  int read_stage = 0, write_stage = STAGES - STEP;
  for (int t = 0; t < chunks; t += STEP) {
    cp_async_wait<STAGES / STEP - 2>();  // chunk t has landed (this thread's copies) ...
    __syncthreads();                     // ... everyone's, and everyone is done with chunk t - 1's stage
    if (t + STAGES - STEP < chunks) load_chunk(write_stage);
    cp_async_commit();
#pragma unroll
    for (int h = 0; h < STEP; ++h) {
      if (PAIRS && t + h >= chunks) break;
      const unsigned char* stage = igemm_shared + (read_stage + h) * STAGE_BYTES;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        unsigned a[MI][4], b[NI][2];
        const unsigned char* a_at = stage + a_frag[ks];  // the warp's mma tiles at immediate offsets from here
        const unsigned char* b_at = stage + b_frag[ks];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) ldmatrix_x4(a[mi], a_at + mi * 16 * IG_ROW_BYTES);
#pragma unroll
        for (int nj = 0; nj < NI / 2; ++nj) {
          unsigned q[4];
          ldmatrix_x4(q, b_at + nj * 16 * IG_ROW_BYTES);
          b[2 * nj][0] = q[0];
          b[2 * nj][1] = q[1];
          b[2 * nj + 1][0] = q[2];
          b[2 * nj + 1][1] = q[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) ig_mma<T>(acc[mi][ni], a[mi], b[ni]);
        }
      }
    }
    read_stage = read_stage == STAGES - STEP ? 0 : read_stage + STEP;
    write_stage = write_stage == STAGES - STEP ? 0 : write_stage + STEP;
  }
  cp_async_wait<0>();  // only empty groups are left; the stages become the epilogue's tile
  __syncthreads();

  const int gq = lane >> 2, qq = lane & 3;
  if (splits > 1) {  // split-K: this split's float sums at partial[split] (out's NCHW layout; split 0 adds the
                     // bias), for conv_bwd_weight_igemm_finish to add in split order and round once.  All phases
                     // in one launch: partial has grad_input's layout, the phase's pixels at their places in it
    const I plane = PHASES ? out_plane : pixels;
    float* slice = partial + (I)split * (n * groups * dg) * plane;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const I m = m0 + warp_m + mi * 16 + gq + 8 * h;
        if (m >= M) continue;
        const I image = m / pixels;
        // (m, channel 0 of the group) and the step to the next channel, in out's layout
        const I p = m - image * pixels;
        const I row = channels_last_out ? m * (groups * dg) + (I)g * dg
                                        : (image * groups * dg + (I)g * dg) * plane +
                                              (PHASES ? ig_phase_pixel(p, out_w, phase_first, phase_row_step,
                                                                             phase_column_step)
                                                            : p);
        const I step = channels_last_out ? (I)1 : plane;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = n0 + warp_n + ni * 8 + 2 * qq + e;
            if (col >= dg) continue;
            const float add = has_bias && split == 0 ? to_acc(bias[g * dg + col]) : 0.0f;
            slice[row + (I)col * step] = acc[mi][ni][2 * h + e] + add;
          }
        }
      }
    }
    return;
  }

  if (channels_last_out) {
    ig_store_channels_last<T, I, BM, BN, MI, NI, WARPS_N>(acc, bias, out, has_bias, m0, M, g, dg, groups * dg, n0);
    return;
  }
  // --- epilogue: tile[column][row] = T(acc + bias), then 16-byte stores along the output pixels ---------------
  constexpr int PITCH = BM * (int)sizeof(T) + 16;  // bytes per column; + 16: the accumulator writes of a warp
                                                  // (8 rows x 4 column pairs) hit 32 different banks
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = warp_n + ni * 8 + 2 * qq + e, n = n0 + col;
      const float add = has_bias && n < dg ? to_acc(bias[g * dg + n]) : 0.0f;
      T* column = reinterpret_cast<T*>(igemm_shared + col * PITCH);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        column[warp_m + mi * 16 + gq] = from_acc<T>(acc[mi][ni][e] + add);
        column[warp_m + mi * 16 + gq + 8] = from_acc<T>(acc[mi][ni][2 + e] + add);
      }
    }
  }
  __syncthreads();
  // Thread: the vector of rows m0 + mv * VEC .. + VEC - 1, columns tid / (BM / VEC) + k * (IG_THREADS / (BM / VEC)).
  constexpr int ROW_VECTORS = BM / VEC, COLUMN_STEP = IG_THREADS / ROW_VECTORS;
  static_assert(IG_THREADS % ROW_VECTORS == 0, "whole columns per pass");
  const int mv = tid % ROW_VECTORS;
  I out_row[VEC];  // where each of the thread's pixels lies in out (channel 0 of the group), or -1 past M
  if (out_plane == pixels) {  // out is this GEMM's whole output (a phase covering its plane is the identity)
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const I m = m0 + mv * VEC + e, image = m / pixels;
      out_row[e] = m < M ? (image * groups * dg + (I)g * dg) * pixels + (m - image * pixels) : (I)-1;
    }
  } else {  // a phase of the strided input gradient: its pixel (row, column) of an image lies at first + row *
            // row_step + column * column_step of out's planes of out_plane (`ig_phase_pixel`); one division, then
            // the thread's next pixels by carries (a division per pixel would grow the kernel by some 500
            // instructions, which the performance model charges to every launch)
    const I m = m0 + mv * VEC, image0 = m / pixels, p = m - image0 * pixels;
    I image = image0;
    int row = (int)(p / out_w), column = (int)(p - (I)row * out_w);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      out_row[e] = m + e < M ? (image * groups * dg + (I)g * dg) * out_plane + phase_first + (I)row * phase_row_step +
                                   (I)column * phase_column_step
                             : (I)-1;
      if (++column == out_w) {
        column = 0;
        if (++row == out_h) {
          row = 0;
          ++image;
        }
      }
    }
  }
  for (int col = tid / ROW_VECTORS; col < BN; col += COLUMN_STEP) {
    const int n = n0 + col;
    if (n >= dg) break;
    const unsigned char* src = igemm_shared + col * PITCH + mv * IG_VECTOR_BYTES;
    // vector_store: a vector never straddles two images or two phase rows and lands 16-byte aligned (pixels %
    // VEC == 0 and out aligned; a phase: also column step 1 and its width, first, row step and plane whole VECs)
    if (vector_store) {
      if (out_row[0] >= 0)
        *reinterpret_cast<uint4*>(out + out_row[0] + (I)n * out_plane) = *reinterpret_cast<const uint4*>(src);
    } else {
      const T* values = reinterpret_cast<const T*>(src);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (out_row[e] >= 0) out[out_row[e] + (I)n * out_plane] = values[e];
      }
    }
  }
}

// The forward (and the stride-1 input gradient, and a phase of a strided one: out_plane != pixels).
template <typename T, typename I, int BM, int BN, int STAGES>
__global__ void __launch_bounds__(IG_THREADS) conv_fwd_igemm(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    int groups, int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w,
    int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w,
    int has_bias, int vector_store, int channels_last_out, float* __restrict__ partial, int chunks_per_split,
    I out_plane, I phase_first, I phase_row_step, int phase_column_step) {
  ig_forward<T, I, BM, BN, STAGES, false>(x, weight, bias, out, n, groups, channels_per_group, outputs_per_group,
                                          height, width, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left,
                                          dilation_h, dilation_w, out_h, out_w, has_bias, vector_store,
                                          channels_last_out, partial, chunks_per_split, out_plane, phase_first,
                                          phase_row_step, phase_column_step, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

// The 3-D forward (ops/implicit_gemm.py `igemm_forward_3d`; also the stride-1 3-D input gradient): x (n, depth,
// height, width, C), weight (D, kernel_d * kernel_h * kernel_w, C / G), out NCDHW or channels-last, split-K as the
// 2-D kernel's.  Instantiated for the tiles of IG_3D_TILES and 32-bit indices only (larger problems: the lift).
template <typename T, typename I, int BM, int BN, int STAGES>
__global__ void __launch_bounds__(IG_THREADS) conv_fwd_igemm_3d(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    int groups, int channels_per_group, int outputs_per_group, int depth, int height, int width, int kernel_d,
    int kernel_h, int kernel_w, int stride_d, int stride_h, int stride_w, int pad_front, int pad_top, int pad_left,
    int dilation_d, int dilation_h, int dilation_w, int out_d, int out_h, int out_w, int has_bias, int vector_store,
    int channels_last_out, float* __restrict__ partial, int chunks_per_split) {
  ig_forward<T, I, BM, BN, STAGES, false, true>(
      x, weight, bias, out, n, groups, channels_per_group, outputs_per_group, height, width, kernel_h, kernel_w,
      stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w, out_h, out_w, has_bias, vector_store,
      channels_last_out, partial, chunks_per_split, (I)out_d * out_h * out_w, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      0, 0, 0, depth, out_d, kernel_d, stride_d, dilation_d, pad_front);
}

// All the phases of a strided input gradient in one launch (ops/implicit_gemm.py `_grad_input_one_launch`): the
// window is the phase (0, 0)'s stride-1 GEMM, the grad_* parameters the strided window's, from which each block
// derives its phase (`ig_axis_phase`).  Instantiated only for what `plan_phases` chooses (32-bit indices).
template <typename T, typename I, int BM, int BN, int STAGES>
__global__ void __launch_bounds__(IG_THREADS) conv_fwd_igemm_phases(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    int groups, int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w,
    int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w,
    int has_bias, int vector_store, int channels_last_out, float* __restrict__ partial, int chunks_per_split,
    I out_plane, I phase_first, I phase_row_step, int phase_column_step, int phases_h, int phases_w,
    int grad_stride_h, int grad_stride_w, int grad_dilation_h, int grad_dilation_w, int grad_pad_top,
    int grad_pad_left, int grad_step_h, int grad_step_w, int grad_height, int grad_width, I phase_weight_size) {
  ig_forward<T, I, BM, BN, STAGES, true>(x, weight, bias, out, n, groups, channels_per_group, outputs_per_group,
                                         height, width, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left,
                                         dilation_h, dilation_w, out_h, out_w, has_bias, vector_store,
                                         channels_last_out, partial, chunks_per_split, out_plane, phase_first,
                                         phase_row_step, phase_column_step, phases_h, phases_w, grad_stride_h,
                                         grad_stride_w, grad_dilation_h, grad_dilation_w, grad_pad_top, grad_pad_left,
                                         grad_step_h, grad_step_w, grad_height, grad_width, phase_weight_size);
}

// NCHW (through a batch view: any strides) -> NHWC contiguous: a transpose of the (rows, channels) matrix whose rows
// are every image's pixels in one flat index r = image * H * W + p, so that tiny planes (4 x 4 patches) fill a tile
// with several images.  A tile is CL_ROWS rows x CL_VECTORS 16-byte vectors of channels (64 halves, 32 floats)
// staged in shared memory.  Read: a lane per row, each warp one vector of VEC channels; a lane's VEC loads run
// along pixels across the warp (coalesced where the plane is), packed in registers into its pixel's 16-byte vector
// and stored whole.  Write: lanes along a row's vectors (four rows a warp), 16-byte stores of consecutive channels.
// A row's source address is decoded once per tile (FastDivmod; no division by a run-time int), its channels then
// advance by a stride.  Vector v of row r lies at v ^ (r & 7): 16-byte shared accesses are served a quarter warp
// at a time, and the 8 lanes of each reach 8 different 16-byte bank groups on both sides (8 consecutive rows
// when storing, one row's 8 vectors when loading), so neither side has a bank conflict.  Float inputs are
// rounded to tf32 here when round_tf32 (the one rounding of TF32's operands).
// CL_ROWS and CL_VECTORS come from cupyconv/ops/implicit_gemm.py (KERNELS' definitions), which sizes the grid.
#if !defined(CL_ROWS) || !defined(CL_VECTORS)
#error "implicit_gemm.cu needs the -D options of cupyconv._device.compile_options('implicit_gemm.cu')"
#endif
constexpr int CL_THREADS = CL_ROWS * CL_VECTORS;
static_assert(CL_VECTORS == 8 && CL_ROWS % 8 == 0, "the swizzle v ^ (r & 7) spreads 8 vectors of 8 rows");
template <typename T> struct ClBits;   // the unsigned integer of T's size: the copy moves bits, not values
template <> struct ClBits<__half> { typedef unsigned short type; };
template <> struct ClBits<__nv_bfloat16> { typedef unsigned short type; };
template <> struct ClBits<float> { typedef unsigned type; };
// The 16-byte vector's words from VEC elements' bits (two 16-bit elements a word, the lower channel low).
__device__ __forceinline__ uint4 cl_pack(const unsigned short (&b)[8]) {
  return make_uint4(b[0] | (unsigned)b[1] << 16, b[2] | (unsigned)b[3] << 16, b[4] | (unsigned)b[5] << 16,
                    b[6] | (unsigned)b[7] << 16);
}
__device__ __forceinline__ uint4 cl_pack(const unsigned (&b)[4]) { return make_uint4(b[0], b[1], b[2], b[3]); }
template <typename T> __device__ __forceinline__ T cl_round(T value, int) { return value; }
template <> __device__ __forceinline__ float cl_round<float>(float value, int round_tf32) {
  return round_tf32 ? __uint_as_float(to_tf32(value)) : value;
}
// What rounding to tf32 left of value, itself as tf32: tf32(value) + cl_rest(value) carries float's bits to the
// weight gradient's fused bias sum (16-bit types: nothing is rounded, nothing is written).
__device__ __forceinline__ float cl_rest(float value) {
  return __uint_as_float(to_tf32(value - __uint_as_float(to_tf32(value))));
}
// A vector's elements (VEC of T in 16 bytes) through cl_round, or (floats) cl_rest: 16-bit types pass unchanged.
template <typename T> __device__ __forceinline__ uint4 cl_round_vector(uint4 v, int) { return v; }
template <> __device__ __forceinline__ uint4 cl_round_vector<float>(uint4 v, int round_tf32) {
  if (!round_tf32) return v;
  return make_uint4(to_tf32(__uint_as_float(v.x)), to_tf32(__uint_as_float(v.y)), to_tf32(__uint_as_float(v.z)),
                    to_tf32(__uint_as_float(v.w)));
}
__device__ __forceinline__ uint4 cl_rest_vector(uint4 v) {   // (four floats)
  return make_uint4(__float_as_uint(cl_rest(__uint_as_float(v.x))), __float_as_uint(cl_rest(__uint_as_float(v.y))),
                    __float_as_uint(cl_rest(__uint_as_float(v.z))), __float_as_uint(cl_rest(__uint_as_float(v.w))));
}

// One block's share of a copy: row tiles first_tile, first_tile + tile_step, ... of channel block channel_block
// (CL_VECTORS * VEC channels), through the block's shared tile.  rows = n H W; row_tiles = ceil(rows / CL_ROWS).
// The magics are FastDivmod's multipliers of H W, W and x_inner (cupyconv._kernels.fast_divmod_magic; where I is
// long long the divisions are 64-bit, once per row and tile).  WHOLE_VECTORS: channels % VEC == 0, so a vector's
// channels are all in range or all past the end, and out's rows are whole 16-byte vectors (one store each); else
// every channel is checked and stored on its own.  rest and with_rest: float only.
template <typename T, typename I, bool WHOLE_VECTORS>
__device__ __forceinline__ void cl_copy_tiles(
    uint4* tile, const T* __restrict__ x, T* __restrict__ out, I rows, I row_tiles, I x_inner, I x_stride_outer,
    I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w, int channels, int height, int width,
    unsigned int pixels_magic, unsigned int width_magic, unsigned int inner_magic, int round_tf32,
    T* __restrict__ rest, int with_rest, I first_tile, I tile_step, int channel_block) {
  typedef typename ClBits<T>::type B;
  constexpr int VEC = 16 / sizeof(T);
  const FastDivmod by_pixels(height * width, pixels_magic), by_width(width, width_magic);
  const FastDivmod by_inner((int)x_inner, inner_magic);   // (where I is int: x_inner is below 2^31)
  const int lane = threadIdx.x % CL_ROWS, read_c = channel_block * (CL_VECTORS * VEC) + threadIdx.x / CL_ROWS * VEC;
  const int write_v = threadIdx.x % CL_VECTORS, write_row = threadIdx.x / CL_VECTORS;
  const int write_c = channel_block * (CL_VECTORS * VEC) + write_v * VEC;
  const int read_slot = lane * CL_VECTORS + ((threadIdx.x / CL_ROWS) ^ (lane & 7));
  const int write_slot = write_row * CL_VECTORS + (write_v ^ (write_row & 7));
  for (I t = first_tile; t < row_tiles; t += tile_step) {
    const I r = t * CL_ROWS + lane;
    B b[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) b[e] = 0;
    if (r < rows && read_c < channels) {
      int p, xx;
      const I image = index_divmod<I>(r, by_pixels, p);
      const int y = by_width.divmod(p, xx);
      I origin;
      if constexpr (sizeof(I) == 4) {
        int inner;
        const int outer = by_inner.divmod(image, inner);
        origin = outer * x_stride_outer + inner * x_stride_inner;
      } else {
        origin = BatchView<I>{x_inner, x_stride_outer, x_stride_inner}.image(image);
      }
      const B* src = reinterpret_cast<const B*>(x) + origin + (I)y * x_stride_h + (I)xx * x_stride_w +
                     (I)read_c * x_stride_c;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {   // channel read_c + e: a warp reads it along its 32 rows
        if (WHOLE_VECTORS || read_c + e < channels) b[e] = *src;
        src += x_stride_c;
      }
    }
    tile[read_slot] = cl_pack(b);
    __syncthreads();
    const I w = t * CL_ROWS + write_row;
    if (w < rows && write_c < channels) {
      const uint4 v = tile[write_slot];
      T* to = out + w * channels + write_c;
      if constexpr (WHOLE_VECTORS) {
        *reinterpret_cast<uint4*>(to) = cl_round_vector<T>(v, round_tf32);
        if constexpr (sizeof(T) == 4) {
          if (with_rest) *reinterpret_cast<uint4*>(rest + (to - out)) = cl_rest_vector(v);
        }
      } else {
        const T* values = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (write_c + e < channels) {
            to[e] = cl_round(values[e], round_tf32);
            if constexpr (sizeof(T) == 4) {
              if (with_rest) rest[(to - out) + e] = cl_rest(values[e]);
            }
          }
        }
      }
    }
    __syncthreads();  // the tile is refilled for the next row tile
  }
}

// One copy: its row tiles looped over by blockIdx.x, its channel blocks on blockIdx.y.
template <typename T, typename I, bool WHOLE_VECTORS>
__global__ void __launch_bounds__(CL_THREADS) channels_last_copy(
    const T* __restrict__ x, T* __restrict__ out, I rows, I row_tiles, I x_inner, I x_stride_outer, I x_stride_inner,
    I x_stride_c, I x_stride_h, I x_stride_w, int channels, int height, int width,
    unsigned int pixels_magic, unsigned int width_magic, unsigned int inner_magic, int round_tf32,
    T* __restrict__ rest, int with_rest) {
  __shared__ uint4 tile[CL_ROWS * CL_VECTORS];
  cl_copy_tiles<T, I, WHOLE_VECTORS>(tile, x, out, rows, row_tiles, x_inner, x_stride_outer, x_stride_inner,
                                     x_stride_c, x_stride_h, x_stride_w, channels, height, width, pixels_magic,
                                     width_magic, inner_magic, round_tf32, rest, with_rest, (I)blockIdx.x,
                                     (I)gridDim.x, blockIdx.y);
}

template <typename V> __device__ __forceinline__ V cl_pick(int job, V a, V b, V c) {
  return job == 0 ? a : job == 1 ? b : c;
}

// Two or three copies in one launch (the operands of a tensor-core pass: x or grad_output, the arranged weight and,
// for a backward, x), since a launch costs the host more than such a copy costs the GPU.  Job j owns the blocks
// [block_end{j-1}, block_end{j}) along x (job 2 up to the grid's end), which loop over its row tiles.  Along y the
// grid has the channel blocks of the job with most; job j reads y as (lane, channel block) with its channel blocks
// padded to 2^shift{j}: a job with fewer (a grouped layer's weight: 1 against x's 8-16) runs lanes{j} whole lanes
// of them, each its share of the row tiles, instead of leaving most of its blocks to return at once.  A shift and a
// mask, not a division (two integer divisions a block, ~30 instructions a warp, put p-seed's copy over its DRAM
// time); the padding's blocks and those of an incomplete last lane return.  LANES false (every job one lane: its
// channel blocks padded to a power of two leave no whole lane beside them) reads y as the channel block and leaves
// shift{j} and lanes{j} unread: the decode's ~11 instructions a warp put a one-pass copy's issue time past its DRAM
// time (p-8x8's backward copy on the H200, task lanes2).  Its arguments are channels_last_copy's, picked once per
// block (one copy of the loop in the code).  Whole vectors only (the fast path's operands have them); a job with
// no blocks is never read.
template <typename T, typename I, bool LANES>
__global__ void __launch_bounds__(CL_THREADS) channels_last_copies(
    const T* __restrict__ x0, T* __restrict__ out0, T* __restrict__ rest0, I rows0, I x_inner0, I x_stride_outer0,
    I x_stride_inner0, I x_stride_c0, I x_stride_h0, I x_stride_w0, int channels0, int height0, int width0,
    unsigned int pixels_magic0, unsigned int width_magic0, unsigned int inner_magic0, int with_rest0,
    const T* __restrict__ x1, T* __restrict__ out1, T* __restrict__ rest1, I rows1, I x_inner1, I x_stride_outer1,
    I x_stride_inner1, I x_stride_c1, I x_stride_h1, I x_stride_w1, int channels1, int height1, int width1,
    unsigned int pixels_magic1, unsigned int width_magic1, unsigned int inner_magic1, int with_rest1,
    const T* __restrict__ x2, T* __restrict__ out2, T* __restrict__ rest2, I rows2, I x_inner2, I x_stride_outer2,
    I x_stride_inner2, I x_stride_c2, I x_stride_h2, I x_stride_w2, int channels2, int height2, int width2,
    unsigned int pixels_magic2, unsigned int width_magic2, unsigned int inner_magic2, int with_rest2,
    int shift0, int shift1, int shift2, int lanes0, int lanes1, int lanes2, I block_end0, I block_end1,
    int round_tf32) {
  __shared__ uint4 tile[CL_ROWS * CL_VECTORS];
  const I block = blockIdx.x;
  const int j = block < block_end0 ? 0 : block < block_end1 ? 1 : 2;
  const int channels = cl_pick(j, channels0, channels1, channels2);
  int lanes = 1, lane = 0, channel_block = blockIdx.y;
  if constexpr (LANES) {
    const int shift = cl_pick(j, shift0, shift1, shift2);
    lanes = cl_pick(j, lanes0, lanes1, lanes2);
    lane = blockIdx.y >> shift;
    channel_block = blockIdx.y & ((1 << shift) - 1);
  }
  if (lane >= lanes || channel_block * (CL_VECTORS * 16 / (int)sizeof(T)) >= channels) return;   // (see above)
  const I begin = cl_pick<I>(j, 0, block_end0, block_end1), end = cl_pick<I>(j, block_end0, block_end1, gridDim.x);
  const I rows = cl_pick(j, rows0, rows1, rows2);
  const I row_tiles = (typename Unsigned<I>::type)(rows + CL_ROWS - 1) / CL_ROWS;   // (rows >= 0: a shift)
  cl_copy_tiles<T, I, true>(
      tile, cl_pick(j, x0, x1, x2), cl_pick(j, out0, out1, out2), rows, row_tiles,
      cl_pick(j, x_inner0, x_inner1, x_inner2), cl_pick(j, x_stride_outer0, x_stride_outer1, x_stride_outer2),
      cl_pick(j, x_stride_inner0, x_stride_inner1, x_stride_inner2), cl_pick(j, x_stride_c0, x_stride_c1, x_stride_c2),
      cl_pick(j, x_stride_h0, x_stride_h1, x_stride_h2), cl_pick(j, x_stride_w0, x_stride_w1, x_stride_w2), channels,
      cl_pick(j, height0, height1, height2), cl_pick(j, width0, width1, width2),
      cl_pick(j, pixels_magic0, pixels_magic1, pixels_magic2), cl_pick(j, width_magic0, width_magic1, width_magic2),
      cl_pick(j, inner_magic0, inner_magic1, inner_magic2), round_tf32, cl_pick(j, rest0, rest1, rest2),
      cl_pick(j, with_rest0, with_rest1, with_rest2), (block - begin) * lanes + lane, (end - begin) * (I)lanes,
      channel_block);
}

// Weight gradient, transposed: C = grad_weight^T of the group, rows (c, tap), columns d, reduced over the output
// pixels k = (image, p).  A = x gathered per (c, tap) row and B = grad_out rows, both with the lanes on the
// pixels (coalesced along an output row).  Block z of the grid reduces split z: chunks_per_split chunks of
// TC_BK pixels, written as float to partial (splits, D, C / G * taps), the weight's own layout per split.
template <typename T, typename I, int BM, int BN> struct TcWeightGrad {
  typedef typename TcTile<T>::Stage S;
  typedef TcLoad<BM, BM * BN / 32, false> LoadA;
  typedef TcLoad<BN, BM * BN / 32, false> LoadB;
  const T* x; const T* grad_out; float* partial;
  const WindowTap<I>* rows;  // the block's BM rows (c, i, j), decoded once (shared memory; rows past M as row 0)
  BatchView<I> view;
  I K, out_pixels, x_stride_c, x_stride_h, x_stride_w, split_base;
  int M, N, m0, n0, g, groups, channels_per_group, stride_h, stride_w, pad_top, pad_left, height, width;
  FastDivmod out_w;

  typedef typename Unsigned<I>::type U;
  struct AColumn { U origin; int y0, x0; bool inside; };  // k = (image, oy, ox): the window's origin in x, position
  struct BColumn { I offset; bool inside; };             // where grad_out[image][g's d = 0][oy][ox] lies
  __device__ AColumn a_column(I k) const {
    AColumn column = {0, 0, 0, false};
    if (k < K) {
      const I image = k / out_pixels;
      int ox;
      const int oy = out_w.divmod((int)(k - image * out_pixels), ox), y0 = oy * stride_h - pad_top;
      const int x0 = ox * stride_w - pad_left;
      column = {(U)(view.image(image) + (I)(g * channels_per_group) * x_stride_c) + (U)y0 * (U)x_stride_h +
                    (U)x0 * (U)x_stride_w, y0, x0, true};
    }
    return column;
  }
  __device__ S a(const AColumn& column, int rs) const {
    const WindowTap<I> row = rows[LoadA::row(rs)];
    const int y = column.y0 + row.dy, xx = column.x0 + row.dx;  // unsigned compares: also false below 0
    if (!column.inside || (unsigned)y >= (unsigned)height || (unsigned)xx >= (unsigned)width) return S(0.0f);
    return S(x[(I)(column.origin + row.offset)]);  // rows past M read the window's origin: never stored
  }
  __device__ BColumn b_column(I k) const {
    if (k >= K) return {0, false};
    const I image = k / out_pixels;
    return {(image * groups + g) * (I)N * out_pixels + (k - image * out_pixels), true};
  }
  __device__ S b(const BColumn& column, int rs) const {
    const int d = n0 + LoadB::row(rs);
    return d < N && column.inside ? S(grad_out[column.offset + (I)d * out_pixels]) : S(0.0f);
  }
  __device__ I out_row(I m) const { return split_base + (I)(g * N) * M + m; }
  __device__ void store(I row, int n, float value) const { partial[row + (I)n * M] = value; }
};

template <typename T, typename I, int BM, int BN>
__global__ void __launch_bounds__(TC_MAX_THREADS) conv_bwd_weight_tc(
    const T* __restrict__ x, const T* __restrict__ grad_out, float* __restrict__ partial, I n, I x_inner,
    I x_stride_outer, I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
    int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w, int stride_h,
    int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w,
    I chunks_per_split) {
  typedef typename TcTile<T>::Stage S;
  constexpr int P = TcTile<T>::PITCH;
  __shared__ __align__(16) S as[2 * BM * P];
  __shared__ __align__(16) S bs[2 * BN * P];
  __shared__ WindowTap<I> rows[BM];
  TcWeightGrad<T, I, BM, BN> f;
  const int n_tiles = (outputs_per_group + BN - 1) / BN;
  f.x = x; f.grad_out = grad_out; f.partial = partial; f.rows = rows;
  f.view.inner = x_inner; f.view.stride_outer = x_stride_outer; f.view.stride_inner = x_stride_inner;
  f.out_pixels = (I)out_h * out_w; f.K = n * f.out_pixels;
  f.x_stride_c = x_stride_c; f.x_stride_h = x_stride_h; f.x_stride_w = x_stride_w;
  f.M = channels_per_group * kernel_h * kernel_w; f.N = outputs_per_group;
  f.groups = groups; f.channels_per_group = channels_per_group;
  f.stride_h = stride_h; f.stride_w = stride_w; f.pad_top = pad_top; f.pad_left = pad_left;
  f.height = height; f.width = width; f.out_w = FastDivmod(out_w);
  f.g = blockIdx.y / n_tiles; f.n0 = blockIdx.y % n_tiles * BN; f.m0 = blockIdx.x * BM;
  f.split_base = (I)blockIdx.z * groups * outputs_per_group * f.M;
  const FastDivmod taps(kernel_h * kernel_w), kernel_wd(kernel_w);
  for (int r = threadIdx.x; r < BM; r += blockDim.x) {  // the rows' decode, shared by the block's every chunk
    const WindowTap<I> origin = {0, 0, 0};
    rows[r] = f.m0 + r < f.M ? decode_tap<I>(f.m0 + r, taps, kernel_wd, dilation_h, dilation_w, x_stride_c,
                                             x_stride_h, x_stride_w) : origin;
  }
  __syncthreads();  // tc_block's first loads read the rows
  const I k_begin = (I)blockIdx.z * chunks_per_split * TC_BK;
  const I k_end = k_begin + chunks_per_split * TC_BK < f.K ? k_begin + chunks_per_split * TC_BK : f.K;
  tc_block<T, I, BM, BN>(f, as, bs, (I)f.m0, f.n0, k_begin, k_end);
}

// =============================================================================================================
// Weight gradient, channels-last (issue 24): conv_bwd_weight_igemm and its final pass
//
// One GEMM per group, C = grad_weight of the group in (tap, c) order:
//   rows M = d (D / G output channels), columns N = (tap, c) = taps * C / G, reduced over K = the output pixels
//   A[d][p] = gy_cl[p][g D/G + d]                         gy_cl = channels_last(grad_out): (n oH oW, D)
//   B[p][(tap, c)] = x_cl[image][y + dy][x + dx][g C/G + c] x_cl = channels_last(x): (n, H, W, C), zero outside
// with C / G a multiple of 8 (16-bit) or 4 (float, as TF32) so that 16 bytes of a row of either operand are
// 8 (4) consecutive channels of one pixel: one cp.async each, zero-filled (src-size 0) for padding and for
// pixels past the split.  Both operands are staged k-major ([pixel][d], [pixel][(tap, c)]) and read as the mma
// fragments by ldmatrix .trans (16-bit; float reads words).  TF32 is rounded once, by the channels-last copies
// (channels_last_copy with round_tf32): the fragments are the staged words.  The fused bias gradient of TF32
// adds grad_output's tf32 remainder, gy_rest (that copy's second output), which the bias blocks stage beside A.
//
// Shared memory: STAGES stages of BK pixel rows, each row BM (A) or BN (B) elements in 16-byte chunks whose
// position is XOR-swizzled by the row (WgSwizzle): the 8 rows an ldmatrix phase reads, the 8 chunks 8
// consecutive threads copy, and the 4 x 8 words of a float fragment read all land in different banks.
// Pipeline: chunks t + 1 .. t + STAGES - 1 are in flight while the tensor cores work on t; one cp.async group
// per chunk (committed even when empty, so that wait_group<STAGES - 2> always means "chunk t landed") and one
// barrier per chunk, which also tells the block that the stage about to be refilled is no longer read.
// Each thread copies the same 16-byte column of every chunk (fixed channel offsets, precomputed) for a few
// pixel rows whose (image, oy, ox) it advances by BK pixels with a mixed-radix carry: no division in the loop.
//
// Split-K: block z reduces chunks [z * chunks_per_split, ...) of the pixels and writes float sums to its own
// slice of partial (splits, D, N); the bias gradient, when asked, is summed by the blocks of the first column
// tile from their A stages into bias_partial (splits, D).  The last block of a tile to finish (`wg_last_arrival`:
// each writer fences, then one thread counts the block in arrivals[tile]) adds the tile's splits in order (the
// same bits on every run: the split depends on the shapes only, never on which block came last) and writes
// grad_weight in its own layout (D, C / G, kH, kW), permuting (tap, c) -> (c, tap), and grad_bias: no second
// launch (issue 24, deliverable 5).  The last block also sets the count back to 0, so the buffer, kept per
// stream by the caller (`Device.arrival_counters`), is zero for the next launch.
#include "async_copy.cuh"

constexpr int WG_STAGES = 3;

template <typename T> struct WgTile {  // 16-bit: m16n8k16, 32 pixels per chunk
  typedef T S;
  static constexpr int BK = 32, K_STEP = 16, E = 8;  // E: elements per 16-byte chunk
};
template <> struct WgTile<float> {  // TF32: m16n8k8, 16 pixels per chunk (three stages of 64 x 64 in 24 KiB)
  typedef float S;
  static constexpr int BK = 16, K_STEP = 8, E = 4;
};

// The physical 16-byte chunk of logical chunk c in row r of a stage whose rows have CH chunks.  16-bit
// (ldmatrix reads one chunk of 8 consecutive rows): 128-byte rows and wider XOR the row's low 3 bits, 64-byte
// rows (two to a 128-byte line) XOR bits 1-2.  Float (a warp reads words of 2 chunks of rows r .. r + 3): XOR
// 2 (r % 4), so that the 4 rows' chunk pairs fill all 8 chunk positions of a 128-byte line.
template <typename S, int CH> __device__ __forceinline__ int wg_swizzle(int r, int c) {
  static_assert(CH >= 4 && (CH & (CH - 1)) == 0, "rows of 64 bytes or more, a power of two");
  if (sizeof(S) == 4) return c ^ ((r & 3) << 1);
  return CH >= 8 ? c ^ (r & 7) : c ^ ((r >> 1) & 3);
}

// A stage of R rows of COLS elements: where element (r, col) lies, col a multiple of E for a chunk's start.
template <typename S, int COLS> struct WgStage {
  static constexpr int E = 16 / (int)sizeof(S), CH = COLS / E;
  __device__ static __forceinline__ int at(int r, int col) {
    return r * COLS + wg_swizzle<S, CH>(r, col / E) * E + col % E;
  }
};

// The fragment reads of one warp: element offsets within a stage, per lane, fixed for the whole kernel (the
// swizzle of rows k0 + .. equals that of rows 0 + .. since k0 steps by 8 or 16); a K step adds k0 rows.
//   16-bit: a[mi] = ldmatrix.x4.trans of matrices (d 0-7 | 8-15) x (k 0-7 | 8-15) of rows wm + 16 mi ..: lane
//           8 j + i gives row i of matrix j; b[nj] = ldmatrix.x4.trans of (k 0-7 | 8-15) x (n 0-7 | 8-15) of
//           columns wn + 16 nj ..: the b fragments of mma tiles 2 nj and 2 nj + 1.
//   float:  a[mi][h] = column wm + 16 mi + g + 8 h of row q; b[ni] = column wn + 8 ni + g of row q (then + 4
//           rows for the second half of the k8 step).
template <typename S, int BM, int BN, int MI> struct WgFragments {  // MI: mma tiles of 16 rows per warp
  typedef WgStage<S, BM> SA;
  typedef WgStage<S, BN> SB;
  int a[MI][2], b[4];
  __device__ WgFragments(int wm, int wn, int lane) {
    const int i = lane & 7, j = lane >> 3, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a[mi][h] = sizeof(S) == 4 ? SA::at(q, wm + mi * 16 + g + 8 * h) : SA::at((j >> 1) * 8 + i, wm + mi * 16 + (j & 1) * 8);
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) b[n] = sizeof(S) == 4 ? SB::at(q, wn + n * 8 + g) : SB::at((j & 1) * 8 + i, wn + (n & 1) * 16 + (j >> 1) * 8);
  }
};

// One K step (K_STEP pixels from row k0) of a warp's 16 MI x 32 tile: MI x 4 mma tiles of 16 x 8; with `bias`, also
// bias[mi] += A rows x a column of ones (every column of that 16 x 8 tile: the rows' sums over the step).
template <typename S, int BM, int BN, int MI>
__device__ __forceinline__ void wg_warp_step(const S* as, const S* bs, const S*, const WgFragments<S, BM, BN, MI>& f,
                                             int k0, bool bias, float (&acc)[MI][4][4], float (&bias_acc)[MI][4]) {
  unsigned a[MI][4], b[4][2];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) ldmatrix_x4_trans(a[mi], as + f.a[mi][0] + k0 * BM);
#pragma unroll
  for (int nj = 0; nj < 2; ++nj) {
    unsigned r[4];
    ldmatrix_x4_trans(r, bs + f.b[nj] + k0 * BN);
    b[2 * nj][0] = r[0]; b[2 * nj][1] = r[1]; b[2 * nj + 1][0] = r[2]; b[2 * nj + 1][1] = r[3];
  }
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) mma_m16n8k16<S>(acc[mi][ni], a[mi], b[ni]);
  }
  if (bias) {
    const S one = S(1.0f);
    const unsigned ones[2] = {pack2<S>(one, one), pack2<S>(one, one)};
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) mma_m16n8k16<S>(bias_acc[mi], a[mi], ones);
  }
}

// TF32: both operands were rounded to tf32 once, by their channels-last copies (`channels_last_copy`), so the
// fragments are the staged words as they are; the bias gradient adds grad_output's remainder, staged beside it
// in rs (the same layout as as): tf32 + the tf32 of the rest, so the bias sums lose no more than float's bits.
template <typename S> __device__ __forceinline__ unsigned wg_word(const S* at) {
  return *reinterpret_cast<const unsigned*>(at);
}
template <int BM, int BN, int MI>
__device__ __forceinline__ void wg_warp_step(const float* as, const float* bs, const float* rs,
                                             const WgFragments<float, BM, BN, MI>& f, int k0, bool bias,
                                             float (&acc)[MI][4][4], float (&bias_acc)[MI][4]) {
  unsigned a[MI][4], b[4][2];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    a[mi][0] = wg_word(as + f.a[mi][0] + k0 * BM);
    a[mi][1] = wg_word(as + f.a[mi][1] + k0 * BM);
    a[mi][2] = wg_word(as + f.a[mi][0] + (k0 + 4) * BM);
    a[mi][3] = wg_word(as + f.a[mi][1] + (k0 + 4) * BM);
  }
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    b[ni][0] = wg_word(bs + f.b[ni] + k0 * BN);
    b[ni][1] = wg_word(bs + f.b[ni] + (k0 + 4) * BN);
  }
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) mma_m16n8k8_tf32(acc[mi][ni], a[mi], b[ni]);
  }
  if (bias) {
    const unsigned ones[2] = {0x3f800000u, 0x3f800000u};  // 1.0f, exact in tf32
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const unsigned rest[4] = {wg_word(rs + f.a[mi][0] + k0 * BM), wg_word(rs + f.a[mi][1] + k0 * BM),
                                wg_word(rs + f.a[mi][0] + (k0 + 4) * BM), wg_word(rs + f.a[mi][1] + (k0 + 4) * BM)};
      mma_m16n8k8_tf32(bias_acc[mi], a[mi], ones);
      mma_m16n8k8_tf32(bias_acc[mi], rest, ones);
    }
  }
}

// Where one B row of a thread reads: the output pixel's window origin in x without the padding (y = oy * stride_h,
// x = ox * stride_w) and the offset of (image, y, x) in x_cl, advanced by BK pixels with one carry per digit
// (the steps precomputed in WgSteps, with the x and y steps below a row and an image): no division in the loop.
template <typename I> struct WgSteps {
  typedef typename Unsigned<I>::type U;
  int x, y, x_limit, y_limit, carry_x_y;  // x, y: the steps of x and y; limits: out_w * stride_w, out_h * stride_h
  U base, carry_x, carry_y;               // offset steps: BK pixels, and what each carry adds
  // (x_cl: `channels` a pixel, row_size = width * channels, image_size = height * row_size)
  __device__ WgSteps(int BK, I out_pixels, int out_h, int out_w, int stride_h, int stride_w, I row_size,
                     I image_size, int channels) {
    const I step_image = BK / out_pixels;
    const int step_y = (int)(BK % out_pixels) / out_w, step_x = (int)(BK % out_pixels) % out_w;
    x = step_x * stride_w; y = step_y * stride_h;
    x_limit = out_w * stride_w; y_limit = out_h * stride_h; carry_x_y = stride_h;
    base = (U)step_image * (U)image_size + (U)y * (U)row_size + (U)x * (U)channels;
    carry_x = (U)stride_h * (U)row_size - (U)x_limit * (U)channels;
    carry_y = (U)image_size - (U)y_limit * (U)row_size;
  }
};
template <typename I> struct WgPixel {
  typedef typename Unsigned<I>::type U;
  U offset;
  int y, x;
  // output pixel p's window origin (without the padding) in x_cl
  __device__ static __forceinline__ WgPixel at(I p, I out_pixels, int out_w, int stride_h, int stride_w, I row_size,
                                              I image_size, int channels) {
    const I image = p / out_pixels;
    const int rest = (int)(p - image * out_pixels), y = rest / out_w * stride_h, x = rest % out_w * stride_w;
    return {(U)image * (U)image_size + (U)y * (U)row_size + (U)x * (U)channels, y, x};
  }
  __device__ __forceinline__ void advance(const WgSteps<I>& s) {
    x += s.x;
    y += s.y;
    offset += s.base;
    if (x >= s.x_limit) { x -= s.x_limit; y += s.carry_x_y; offset += s.carry_x; }
    if (y >= s.y_limit) { y -= s.y_limit; offset += s.carry_y; }
  }
};

// The weight gradients' pipeline over a block's `chunks`: load_chunk(stage) issues a chunk's copies into a stage,
// step(stage) runs the warps' K steps on a landed one (the header comment above: one commit group per chunk,
// empty ones too, and one barrier per chunk).
template <class Load, class Step>
__device__ __forceinline__ void wg_pipeline(int chunks, Load& load_chunk, const Step& step) {
#pragma unroll
  for (int s = 0; s < WG_STAGES - 1; ++s) {
    if (s < chunks) load_chunk(s);
    cp_async_commit();
  }
  int read_stage = 0, write_stage = WG_STAGES - 1;
  for (int t = 0; t < chunks; ++t) {
    cp_async_wait<WG_STAGES - 2>();  // chunk t has landed (this thread's copies) ...
    __syncthreads();                 // ... everyone's, and stage (t - 1) % STAGES is no longer read
    if (t + WG_STAGES - 1 < chunks) load_chunk(write_stage);
    cp_async_commit();
    step(read_stage);
    read_stage = read_stage == WG_STAGES - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == WG_STAGES - 1 ? 0 : write_stage + 1;
  }
  cp_async_wait<0>();  // (only empty groups are left: nothing lands after the block ends)
}

// Whether this block is the last of its tile's gridDim.z splits to have written its partial sums (`last_arrival`,
// common.cuh; every block of a launch without splits is).  The verdict goes through `flag`, a word of the
// pipeline's stages (the 128 x 128 16-bit stages fill the 48 KiB of static shared memory; a variable of its own
// would pass it).
__device__ __forceinline__ bool wg_last_arrival(int* arrivals, int tile, int* flag) {
  return last_arrival(arrivals, tile, (int)gridDim.z, flag);
}

// The last block's sums of its tile: this thread's first `count` (<= ELEMS) elements, element e at from + e * step
// in split 0's sums (each split's `slice` further on) and at to + e * step in grad_weight (or grad_bias).  The
// splits are read P at a time with every element's load of those splits in flight at once: a round trip per P
// splits, not per element and split (a block alone sums a tile's splits: its memory parallelism is the tail's
// time).  conv_bwd_weight_igemm's 64 x 64 and 32 x 64 tiles (32 elements a thread) read two splits a trip
// (WG_FINISH_SPLITS): 64 loads in flight, in registers the main loop's accumulators leave free (97 -> 119 on
// sm_90, still 4 blocks of 128 a SM); its 128-row tiles (64 elements a thread) do the same in two passes of 32
// elements (64 sums and 64 loads at once did not fit the 128 x 128 tile's 128 registers); the groups kernel and
// the bias keep one (more splits a trip cost them occupancy or instructions the model charges more than their
// tails gain).  The addresses advance by `step`
// from one pointer (no pointer a load kept in registers: the tail stays within the main loop's registers).  Each
// element adds split 0, 1, ... to 0 in order, whatever the splits a trip: the bits of
// conv_bwd_weight_igemm_finish.  WHOLE (the final pass's): a trip of P splits before the last reads them without
// asking each load whether its split is past the last (the final pass is a chain of these loads: their tests were
// a third of its instructions), the last trip with the tests.
template <int ELEMS> constexpr int WG_FINISH_SPLITS = ELEMS == 32 ? 2 : 1;
template <int ELEMS, int P, typename I>
__device__ __forceinline__ void wg_trip(float (&v)[P][ELEMS], const float* from, I step, I slice, int left,
                                        int count) {  // left: the splits from this trip's first on
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float* at = from + p * slice;
#pragma unroll
    for (int e = 0; e < ELEMS; ++e, at += step) v[p][e] = e < count && p < left ? __ldcg(at) : 0.0f;
  }
}
template <int ELEMS, typename T, typename I, int P = 1, bool WHOLE = false>
__device__ __forceinline__ void wg_finish(const float* from, T* to, I step, I slice, int splits, int count) {
  float sum[ELEMS];
#pragma unroll
  for (int e = 0; e < ELEMS; ++e) sum[e] = 0.0f;
  for (int z = 0; z < splits; z += P, from += P * slice) {
    float v[P][ELEMS];
    if (WHOLE && z + P <= splits) {
      wg_trip(v, from, step, slice, P, count);  // (p < P: the compiler drops the test)
    } else {
      wg_trip(v, from, step, slice, splits - z, count);
    }
    // (past the last split v is +0.0, whose add leaves every sum's bits: a sum that starts at +0.0 is never -0.0)
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int e = 0; e < ELEMS; ++e) sum[e] += v[p][e];
    }
  }
#pragma unroll
  for (int e = 0; e < ELEMS; ++e, to += step) {
    if (e < count) *to = from_acc<T>(sum[e]);
  }
}

// A thread's two neighbouring float sums of an mma fragment (columns 2 q, 2 q + 1) in one 8-byte store, at an even
// column of rows of an even count of floats: a warp's 8 rows x 4 pairs write 8 whole 32-byte sectors, each once
// (as two 4-byte stores, every sector twice, half each time: 1024 -> 512 L1 wavefronts a 64 x 64 block).
__device__ __forceinline__ void wg_store_sums(float* at, float lo, float hi) {
  *reinterpret_cast<float2*>(at) = make_float2(lo, hi);
}

// The blocks an SM must hold (`__launch_bounds__`): on sm_90 the 128 x 128 tile with 32-bit indices two, at most
// 128 registers, which its main loop fits without spilling at 200 instructions a chunk instead of 175 (one block
// of 8 warps an SM left its grids latency-bound); with 64-bit indices, or on sm_80, it would spill there and keeps
// one.  The other tiles' registers hold 3-8 blocks an SM: `WG_BLOCKS_AN_SM` in ops/implicit_gemm.py (sm_90),
// checked by tests/test_sass.py.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int WG_WIDE_MIN_BLOCKS = 2;
#else
constexpr int WG_WIDE_MIN_BLOCKS = 1;
#endif
template <typename I, int BM, int BN>
constexpr int WG_MIN_BLOCKS = sizeof(I) == 4 && BM * BN >= 128 * 128 ? WG_WIDE_MIN_BLOCKS : 1;
template <typename T, typename I, int BM, int BN>
__global__ void __launch_bounds__(TC_MAX_THREADS, WG_MIN_BLOCKS<I, BM, BN>) conv_bwd_weight_igemm(
    const T* __restrict__ x_cl, const T* __restrict__ gy_cl, const T* __restrict__ gy_rest,
    float* __restrict__ partial, float* __restrict__ bias_partial, T* __restrict__ grad_weight,
    T* __restrict__ grad_bias, int* __restrict__ arrivals, int finish, I n, int groups, int channels_per_group,
    int outputs_per_group, int height, int width, int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_top,
    int pad_left, int dilation_h, int dilation_w, int out_h, int out_w, I chunks_per_split, int has_bias) {
  typedef WgTile<T> W;
  typedef typename W::S S;
  typedef typename Unsigned<I>::type U;
  typedef WgStage<S, BM> SA;
  typedef WgStage<S, BN> SB;
  constexpr int WM = BM >= 128 ? 64 : 32, MI = WM / 16;  // warp tiles of WM x 32: 64 rows in the 128-row tile
  constexpr int THREADS = BM / WM * BN, BK = W::BK, E = W::E;
  constexpr int A_ROWS_PER_PASS = THREADS / SA::CH, A_COPIES = BK / A_ROWS_PER_PASS;  // per thread and chunk
  constexpr int B_ROWS_PER_PASS = THREADS / SB::CH, B_COPIES = BK / B_ROWS_PER_PASS;
  constexpr int A_STAGE = BK * BM, B_STAGE = BK * BN;
  static_assert(THREADS % SA::CH == 0 && THREADS % SB::CH == 0 && A_COPIES >= 1 && B_COPIES >= 1 &&
                BK % A_ROWS_PER_PASS == 0 && BK % B_ROWS_PER_PASS == 0, "whole chunk columns and rows per thread");
  // TF32: grad_output's tf32 remainder, rs, after as's stages (staged by the bias gradient's blocks only);
  // 16-bit: none (rs is never read)
  constexpr int R_STAGE = sizeof(S) == 4 ? A_STAGE : 0;
  __shared__ __align__(128) S as[WG_STAGES * (A_STAGE + R_STAGE)];  // [stage][pixel][d], swizzled
  __shared__ __align__(128) S bs[WG_STAGES * B_STAGE];  // [stage][pixel][(tap, c)], swizzled
  S* const rs = as + WG_STAGES * A_STAGE;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / (BN / 32) * WM, wn = warp % (BN / 32) * 32;
  const int taps = kernel_h * kernel_w, M = outputs_per_group, N = taps * channels_per_group;
  const int n_tiles = (N + BN - 1) / BN, g = blockIdx.y / n_tiles, n0 = blockIdx.y % n_tiles * BN;
  const int m0 = blockIdx.x * BM, D = groups * outputs_per_group, C = groups * channels_per_group;
  const I out_pixels = (I)out_h * out_w, K = n * out_pixels;
  const I k_begin = (I)blockIdx.z * chunks_per_split * BK;
  const I k_end = k_begin + chunks_per_split * BK < K ? k_begin + chunks_per_split * BK : K;
  const int chunks = (int)((k_end - k_begin + BK - 1) / BK);

  // A: this thread's chunk column (d .. d + E - 1) of rows a_row + r A_ROWS_PER_PASS; its pointer advances BK rows
  // a chunk.  Columns past M read nothing (their zeros meet only rows never stored).
  const int a_col = tid % SA::CH * E, a_row = tid / SA::CH;
  const bool a_inside = m0 + a_col < M;
  const I a_first = (k_begin + a_row) * D + g * outputs_per_group + m0 + a_col;
  const T* a_src = gy_cl + a_first;
  const T* r_src = gy_rest + a_first;
  // TF32 blocks that sum the bias gradient also stage grad_output's remainder (block-uniform)
  const bool stage_rest = sizeof(S) == 4 && has_bias && n0 == 0;
  int a_store[A_COPIES];
#pragma unroll
  for (int r = 0; r < A_COPIES; ++r) a_store[r] = SA::at(a_row + r * A_ROWS_PER_PASS, a_col);

  // B: this thread's chunk column n = (tap, c): the tap's offset in x_cl (with the padding) and bounds, fixed;
  // its rows' pixels.
  const int b_col = tid % SB::CH * E, b_row = tid / SB::CH, nb = n0 + b_col;
  const bool b_inside = nb < N;
  const int tap = b_inside ? nb / channels_per_group : 0, c = nb - tap * channels_per_group;
  const int dy = tap / kernel_w * dilation_h - pad_top, dx = tap % kernel_w * dilation_w - pad_left;
  const I row_size = (I)width * C, image_size = (I)height * row_size;
  const U b_column = (U)dy * (U)row_size + (U)dx * (U)C + (U)(g * channels_per_group + c);
  const WgSteps<I> steps(BK, out_pixels, out_h, out_w, stride_h, stride_w, row_size, image_size, C);
  WgPixel<I> b_pixel[B_COPIES];
  int b_store[B_COPIES];
#pragma unroll
  for (int r = 0; r < B_COPIES; ++r) {
    b_pixel[r] = WgPixel<I>::at(k_begin + b_row + r * B_ROWS_PER_PASS, out_pixels, out_w, stride_h, stride_w,
                                row_size, image_size, C);
    b_store[r] = SB::at(b_row + r * B_ROWS_PER_PASS, b_col);
  }

  I remaining = k_end - k_begin;  // pixels of the split from the next chunk to load on
  auto load_chunk = [&](int stage) {
    S* a_stage = as + stage * A_STAGE;
    S* b_stage = bs + stage * B_STAGE;
#pragma unroll
    for (int r = 0; r < A_COPIES; ++r) {
      const bool inside = a_inside && a_row + r * A_ROWS_PER_PASS < remaining;
      // (a zero-filled copy reads nothing, but gets a pointer into the array all the same: gy_cl itself)
      cp_async_cg_16(a_stage + a_store[r], inside ? a_src + r * A_ROWS_PER_PASS * D : gy_cl, inside ? 16 : 0);
      if (stage_rest) {
        cp_async_cg_16(rs + stage * R_STAGE + a_store[r], inside ? r_src + r * A_ROWS_PER_PASS * D : gy_rest,
                       inside ? 16 : 0);
      }
    }
    a_src += BK * D;
    r_src += BK * D;
#pragma unroll
    for (int r = 0; r < B_COPIES; ++r) {
      WgPixel<I>& px = b_pixel[r];
      const bool inside = b_inside && b_row + r * B_ROWS_PER_PASS < remaining &&
                          (unsigned)(px.y + dy) < (unsigned)height && (unsigned)(px.x + dx) < (unsigned)width;
      cp_async_cg_16(b_stage + b_store[r], x_cl + (inside ? (I)(px.offset + b_column) : (I)0), inside ? 16 : 0);
      px.advance(steps);
    }
    remaining -= BK;
  };

  float acc[MI][4][4], bias_acc[MI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      bias_acc[mi][r] = 0.0f;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) acc[mi][ni][r] = 0.0f;
    }
  }
  // The bias gradient: the first warp column of the blocks of the first column tile sums its A rows with the
  // tensor cores (every d of the block once: no reduction across warps).
  const bool sum_bias = has_bias && n0 == 0 && wn == 0;
  const WgFragments<S, BM, BN, MI> fragments(wm, wn, lane);

  wg_pipeline(chunks, load_chunk, [&](int read_stage) {
    const S* a_stage = as + read_stage * A_STAGE;
    const S* b_stage = bs + read_stage * B_STAGE;
    const S* r_stage = rs + read_stage * R_STAGE;
#pragma unroll
    for (int kk = 0; kk < BK; kk += W::K_STEP) {
      wg_warp_step(a_stage, b_stage, r_stage, fragments, kk, sum_bias, acc, bias_acc);
    }
  });

  // Epilogue: the float sums of this split, (d, n) at partial[z][g D/G + d][n].
  const int gq = lane >> 2, q = lane & 3;
  float* out = partial + ((I)blockIdx.z * D + g * outputs_per_group) * (I)N;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m0 + wm + mi * 16 + gq + 8 * half;
      if (m >= M) continue;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int nn = n0 + wn + ni * 8 + 2 * q;  // (N is a multiple of 4: nn + 1 < N where nn < N)
        if (nn < N) wg_store_sums(out + (I)m * N + nn, acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      }
      if (sum_bias && q == 0) bias_partial[(I)blockIdx.z * D + g * outputs_per_group + m] = bias_acc[mi][2 * half];
    }
  }

  // The last split of the tile to arrive: grad_weight[g D/G + m][c][tap] of its (m, n = (tap, c)); a thread takes
  // column n0 + tid % BN (the sums' reads coalesce along n) of every ROW_STEP-th row, and the first column tile's
  // blocks write grad_bias of their rows.
  // (finish 0: conv_bwd_weight_igemm_finish adds the splits, `weight_igemm_plan`; block-uniform)
  if (!finish) return;
  if (!wg_last_arrival(arrivals, blockIdx.x + gridDim.x * blockIdx.y, reinterpret_cast<int*>(bs))) return;
  constexpr int ROW_STEP = THREADS / BN, ELEMS = BM / ROW_STEP;
  static_assert(THREADS % BN == 0 && BM % ROW_STEP == 0, "whole rows of the tile per pass");
  const int nn = n0 + tid % BN, row = tid / BN, rows = M - m0 - row;  // rows: of M from this thread's first on
  const int count = nn < N && rows > 0 ? min((rows + ROW_STEP - 1) / ROW_STEP, ELEMS) : 0;
  const int t = nn / channels_per_group, cc = nn - t * channels_per_group;
  const I first = (I)(g * outputs_per_group + m0 + row) * N;
  // At most 32 elements a pass (`wg_finish`: the 128-row tiles' 64 in two passes of two splits a trip, as many
  // round trips as one pass of one split a trip)
  constexpr int PASS = ELEMS < 32 ? ELEMS : 32;
  wg_finish<PASS, T, I, WG_FINISH_SPLITS<PASS>>(partial + first + nn, grad_weight + first + (I)cc * taps + t,
                                                (I)ROW_STEP * N, (I)D * N, (int)gridDim.z, min(count, PASS));
  if (ELEMS > PASS && count > PASS) {
    const I half = (I)PASS * ROW_STEP * N;
    wg_finish<PASS, T, I, WG_FINISH_SPLITS<PASS>>(partial + first + nn + half,
                                                  grad_weight + first + (I)cc * taps + t + half, (I)ROW_STEP * N,
                                                  (I)D * N, (int)gridDim.z, count - PASS);
  }
  if (has_bias && n0 == 0 && tid < BM) {
    const int d = g * outputs_per_group + m0 + tid;
    wg_finish<1>(bias_partial + d, grad_bias + d, (I)0, (I)D, (int)gridDim.z, m0 + tid < M);
  }
}

// The final pass: grad_weight[d][c][tap] = sum over the splits, in order, of partial[z][d][tap * C/G + c],
// rounded once to T; and grad_bias[d] from bias_partial alike.  A grid-stride loop over the sums' elements in
// their own order (d, tap, c), so that a warp's loads of a split are 128 consecutive bytes and only the stores
// (2-4 bytes an element, splits x fewer than the loads) scatter by the permutation.  The pass is a stream of
// splits x size floats that a thread cannot hide by others (one element a thread): it reads WG_PASS_SPLITS
// splits a trip, their loads in flight at once (`wg_finish`), a round trip per 16 splits instead of per split
// and element.  (The weight gradients themselves finish in their kernels, `wg_finish`, to these bits: every
// element adds split 0, 1, ... in order whatever the splits a trip; the tests hold them to it.)
// Also conv_fwd_igemm's (taps 1: an elementwise sum in out's layout, phase_width 0), and a phase's of the strided
// input gradient (phase_width > 0: its pixels written to their places in grad_input, `ig_phase_pixel`).
constexpr int WG_PASS_SPLITS = 16;
template <typename T, typename I>
__global__ void conv_bwd_weight_igemm_finish(const float* __restrict__ partial, const float* __restrict__ bias_partial,
                                             T* __restrict__ grad_weight, T* __restrict__ grad_bias, int splits,
                                             int out_channels, int channels_per_group, int taps, int has_bias,
                                             I out_plane, I phase_first, I phase_row_step, int phase_column_step,
                                             int phase_width) {
  const I N = (I)taps * channels_per_group, size = out_channels * N;
  for (I i = grid_start<I>(); i < size; i += grid_stride<I>()) {
    const I d = i / N;
    const int rest = (int)(i - d * N), tap = rest / channels_per_group, c = rest - tap * channels_per_group;
    // phase_width > 0: conv_fwd_igemm's splits of a phase (taps 1, no bias, NCHW; channels_per_group: the phase's
    // pixels): plane d's pixel `rest` goes to its pixel of grad_input's plane d
    const I to = phase_width > 0 ? d * out_plane + ig_phase_pixel((I)rest, phase_width, phase_first, phase_row_step,
                                                                  phase_column_step)
                                 : d * N + (I)c * taps + tap;
    wg_finish<1, T, I, WG_PASS_SPLITS, true>(partial + i, grad_weight + to, (I)0, size, splits, 1);
    if (has_bias && i < out_channels) {
      wg_finish<1, T, I, WG_PASS_SPLITS, true>(bias_partial + i, grad_bias + i, (I)0, (I)out_channels, splits, 1);
    }
  }
}

// =================================================================================================================
// Forward and stride-1 input gradient of small groups, several groups a block (issue 24, deliverable 6)
// =================================================================================================================
//
// conv_fwd_igemm gives every group blocks of its own, 32 columns wide: with 16 channels per group half of each
// tile's MMAs are padding, and K = 16 x taps is a few chunks, so its prologue and epilogue dominate.  Here a block
// covers GROUPS = CHANNELS / CG consecutive groups of CG channels in and out (channels_per_group =
// outputs_per_group = CG, checked by the planner, `groups_igemm_refusal`): CHANNELS = 128 bytes of channels per
// pixel, 64 of a 16-bit type (4 groups of 16 or 2 of 32), 32 floats as TF32 (2 groups of 16; operands rounded to
// tf32 once, by their channels-last copies).  K chunk t is tap t of all CHANNELS:
//   A  BM output pixels x CHANNELS input channels of the tap (8 cp.async vectors a row, zero-filled past the image
//      or the last group), x read once for every group of the block;
//   B  the tap's block-diagonal CG x CHANNELS slice of the weight: row d holds output channel d of each of the
//      block's groups in that group's CG columns (weight arranged (D, taps, CG) as for conv_fwd_igemm).
// Both rows are 128 bytes with vector v of row r at v ^ (r & 7): the 8 rows of an ldmatrix phase, and the 8 vectors
// a quarter warp of cp.async writes, fall in 8 different 16-byte bank groups.  Warp w computes group w / (4 /
// GROUPS) of the block, on rows (w % (4 / GROUPS)) x BM / (4 / GROUPS) of the tile: its columns of A against the
// same columns of B, CG / 2 VEC k-steps a chunk (m16n8k16, or TF32's m16n8k8: two 16-byte vectors of k either
// way); the zero blocks of the block-diagonal B are never multiplied.
// Same pipeline as conv_fwd_igemm (STAGES, one commit group per chunk, one wait + barrier per chunk).  Epilogue:
// T(acc + bias) through shared memory, then 16-byte stores of 8 pixels of one channel (NCHW; where vector_store is
// 0, scalar stores, a warp's along 32 consecutive pixels) or, channels_last_out, of 8 channels of one pixel, a
// pixel's 128 bytes on 8 lanes.
// 8 channels of a 16-bit type a group (ResNeXt's rx-256; forward and stride-1 input gradient only): GROUPS = 8, a
// group's channels one 16-byte vector, half a k16 step.  A chunk is then two taps, each staged as above (A: two
// BM-row tiles, B: rows (tap, d)), and its k step the group's vector of either tap: k lo from the first, k hi from
// the second; a tap past the last (odd tap counts: 9 taps, 5 chunks) is zeros in A and B.  Each warp computes two
// groups over all BM rows (one n tile each), so still no MMA on the zero blocks, and the ldmatrix_x4 of B gives
// both groups' n tiles.
// No split of K: K is taps chunks, and the grids of the layers this serves fill the GPU (`plan_igemm_groups`).
constexpr int IGG_ROW_BYTES = 128;                    // a staged row, a block's channels: 8 vectors of 16 bytes
constexpr int IGG_ROW_VECTORS = IGG_ROW_BYTES / IG_VECTOR_BYTES;

// Byte offset of vector v of staged row r (8 vectors a row): the XOR swizzle.
__device__ __forceinline__ int igg_swizzle(int r, int v) { return r * IGG_ROW_BYTES + ((v ^ (r & 7)) << 4); }

template <typename T, typename I, int BM, int CG, int STAGES>
__global__ void __launch_bounds__(IG_THREADS) conv_fwd_igemm_groups(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    int groups, int height, int width, int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_top,
    int pad_left, int dilation_h, int dilation_w, int out_h, int out_w, int has_bias, int vector_store,
    int channels_last_out) {
  typedef typename Unsigned<I>::type U;
  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T);
  constexpr int CHANNELS = IGG_ROW_BYTES / (int)sizeof(T);  // of a block, in and out: 64 halves, 32 floats
  constexpr int GROUPS = CHANNELS / CG, GROUP_VECTORS = CG / VEC;
  // a group of one vector (8 channels of a 16-bit type) is half a k16 step: a chunk is two taps, the k step
  // their two vectors (the second zero past the last tap: 9 taps, 5 chunks)
  constexpr int CHUNK_TAPS = GROUP_VECTORS == 1 ? 2 : 1;
  constexpr int WARPS_PER_GROUP = GROUPS < 4 ? 4 / GROUPS : 1, GROUPS_PER_WARP = GROUPS > 4 ? GROUPS / 4 : 1;
  constexpr int WM = BM / WARPS_PER_GROUP, MI = WM / 16, NI = CG / 8, NT = GROUPS_PER_WARP * NI;
  constexpr int K_STEPS = CHUNK_TAPS * GROUP_VECTORS / 2;
  constexpr int ROW_STEP = IG_THREADS / IGG_ROW_VECTORS;  // rows of one pass of the block's copies
  constexpr int A_TAP_BYTES = BM * IGG_ROW_BYTES, B_STAGE_ROWS = CHUNK_TAPS * CG;  // B rows (tap u, channel d)
  constexpr int A_ROWS = BM / ROW_STEP, B_ROWS = B_STAGE_ROWS / ROW_STEP;
  constexpr int STAGE_BYTES = CHUNK_TAPS * A_TAP_BYTES + B_STAGE_ROWS * IGG_ROW_BYTES;
  static_assert(GROUPS >= 2 && (4 % GROUPS == 0 || GROUPS % 4 == 0) && CG % VEC == 0 && K_STEPS >= 1 &&
                    WM % 16 == 0 && BM % ROW_STEP == 0 && B_STAGE_ROWS % ROW_STEP == 0 && NT % 2 == 0 &&
                    (GROUPS_PER_WARP == 1 || NT == 2),
                "tile shape");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int channels = groups * CG, taps = kernel_h * kernel_w, K = taps * CG;
  const int chunks = (taps + CHUNK_TAPS - 1) / CHUNK_TAPS;
  const int c0 = (int)blockIdx.y * CHANNELS;  // the block's first channel, in and out (group c0 / CG)
  const I pixels = (I)out_h * out_w, M = n * pixels, m0 = (I)blockIdx.x * BM;

  // --- what this thread copies: vector v (channels c0 + 8 v ..) of A and B rows row0 + ROW_STEP i -------------
  const int v = tid % IGG_ROW_VECTORS, row0 = tid / IGG_ROW_VECTORS;
  const int store_offset = igg_swizzle(row0, v);  // + ROW_STEP i rows: r & 7 is the same for every i
  const bool v_inside = c0 + v * VEC < channels;  // past the last group (a block it does not fill): zeros
  U a_base[A_ROWS];
  int a_y[A_ROWS], a_x[A_ROWS];
#pragma unroll
  for (int i = 0; i < A_ROWS; ++i) {
    const I m = m0 + row0 + ROW_STEP * i;
    a_y[i] = -(1 << 30);  // rows past M read nothing: every y is out of range (the reach is below 2^30)
    a_x[i] = 0;
    a_base[i] = 0;
    if (m < M) {
      const I image = m / pixels;
      const int p = (int)(m - image * pixels), oy = p / out_w, ox = p - oy * out_w;
      a_y[i] = -pad_top + oy * stride_h;
      a_x[i] = -pad_left + ox * stride_w;
      a_base[i] = (U)(image * height * width * channels + (I)(c0 + v * VEC)) +
                  ((U)a_y[i] * (U)width + (U)a_x[i]) * (U)channels;
    }
  }
  // B row u CG + d, vector v: output channel d of the vector's group, its channels (v VEC) % CG, tap u of the
  // chunk (u = 0 but for two-tap chunks); + CHUNK_TAPS CG a chunk
  I b_offset[B_ROWS];
#pragma unroll
  for (int i = 0; i < B_ROWS; ++i) {
    const int d = (row0 + ROW_STEP * i) % CG, u = (row0 + ROW_STEP * i) / CG, group_first = c0 + v * VEC / CG * CG;
    b_offset[i] = v_inside ? (I)(group_first + d) * K + v * VEC % CG + u * CG : (I)0;
  }
  // The tap (r, s) of the next chunk's first tap, at tap_offset from a window's origin, advanced by increments
  int tap = 0, s = 0, tap_dy = 0, tap_dx = 0;
  U tap_offset = 0;
  const U step_s = (U)dilation_w * (U)channels;                                        // s + 1
  const U step_r = (U)dilation_h * (U)width * (U)channels - (U)kernel_w * step_s;       // r + 1, s = 0

  auto load_chunk = [&](int stage) {  // the thread's vectors of the next chunk's taps, then advance past them
    unsigned char* a_stage = igemm_shared + stage * STAGE_BYTES;
    unsigned char* b_stage = a_stage + CHUNK_TAPS * A_TAP_BYTES;
#pragma unroll
    for (int u = 0; u < CHUNK_TAPS; ++u) {
      // a tap past the last (an odd count in two-tap chunks): zeros in A and B, never stale values (0 x inf)
      const bool tap_inside = CHUNK_TAPS == 1 || tap + u < taps;
#pragma unroll
      for (int i = 0; i < A_ROWS; ++i) {
        const bool inside = tap_inside && v_inside && (unsigned)(a_y[i] + tap_dy) < (unsigned)height &&
                            (unsigned)(a_x[i] + tap_dx) < (unsigned)width;
        const T* src = inside ? x + (I)(a_base[i] + tap_offset) : x;  // padding: zero-fill, x itself not read
        const int bytes = inside ? IG_VECTOR_BYTES : 0;
        cp_async_cg_16(a_stage + u * A_TAP_BYTES + store_offset + ROW_STEP * i * IGG_ROW_BYTES, src, bytes);
      }
      tap_offset += step_s;
      tap_dx += dilation_w;
      if (++s == kernel_w) {
        s = 0;
        tap_dx = 0;
        tap_dy += dilation_h;
        tap_offset += step_r;
      }
    }
#pragma unroll
    for (int i = 0; i < B_ROWS; ++i) {
      const bool inside = v_inside && (CHUNK_TAPS == 1 || tap + (row0 + ROW_STEP * i) / CG < taps);
      cp_async_cg_16(b_stage + store_offset + ROW_STEP * i * IGG_ROW_BYTES, inside ? weight + b_offset[i] : weight,
                     inside ? IG_VECTOR_BYTES : 0);
      b_offset[i] += CHUNK_TAPS * CG;
    }
    tap += CHUNK_TAPS;
  };

  // --- fragments: the warp's groups and rows; the row addresses this lane gives ldmatrix ----------------------
  // The warp's columns: GROUPS_PER_WARP groups from warp_col (8 channels a group: 2 groups of one n tile each)
  const int warp_col = warp / WARPS_PER_GROUP * GROUPS_PER_WARP * CG, warp_m = warp % WARPS_PER_GROUP * WM;
  const int j = lane >> 3, jr = lane & 7;
  // k vector kv of a group's chunk (two a k step): tap kv / GROUP_VECTORS of the chunk, vector kv % GROUP_VECTORS
  int a_frag[GROUPS_PER_WARP * K_STEPS], b_frag[K_STEPS];
#pragma unroll
  for (int ks = 0; ks < K_STEPS; ++ks) {
    // A: (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15, k hi) = a[0..3], of each group
    const int ka = 2 * ks + (j >> 1);
#pragma unroll
    for (int gw = 0; gw < GROUPS_PER_WARP; ++gw)
      a_frag[gw * K_STEPS + ks] = igg_swizzle(ka / GROUP_VECTORS * BM + warp_m + (j & 1) * 8 + jr,
                                              (warp_col + gw * CG) / VEC + ka % GROUP_VECTORS);
    // B (n-major rows): (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi) = b of two n tiles (8
    // channels a group: n tile t is group t's 8 rows); n tiles 2 nj.. lie 16 nj rows further on
    const int kb = 2 * ks + (j & 1), column = warp_col + (j >> 1) * 8;
    b_frag[ks] = CHUNK_TAPS * A_TAP_BYTES + igg_swizzle(kb / GROUP_VECTORS * CG + column % CG + jr,
                                                        column / CG * GROUP_VECTORS + kb % GROUP_VECTORS);
  }
  ig_keep_in_register(a_frag);
  ig_keep_in_register(b_frag);

  float acc[MI][NT][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][nt][e] = 0.0f;
    }
  }

  // --- the pipeline: chunk t is tap t (taps 2 t, 2 t + 1 in two-tap chunks) ------------------------------------
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < chunks) load_chunk(t);
    cp_async_commit();  // empty groups too: the count of groups in flight stays STAGES - 1
  }
  int read_stage = 0, write_stage = STAGES - 1;
  for (int t = 0; t < chunks; ++t) {
    cp_async_wait<STAGES - 2>();  // chunk t has landed (this thread's copies) ...
    __syncthreads();              // ... every thread's, and every warp is done with chunk t - 1's stage
    if (t + STAGES - 1 < chunks) load_chunk(write_stage);
    cp_async_commit();
    const unsigned char* stage = igemm_shared + read_stage * STAGE_BYTES;
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ++ks) {
      unsigned b[NT][2];
      const unsigned char* b_at = stage + b_frag[ks];
#pragma unroll
      for (int nj = 0; nj < NT / 2; ++nj) {
        unsigned q[4];
        ldmatrix_x4(q, b_at + nj * 16 * IGG_ROW_BYTES);
        b[2 * nj][0] = q[0];
        b[2 * nj][1] = q[1];
        b[2 * nj + 1][0] = q[2];
        b[2 * nj + 1][1] = q[3];
      }
#pragma unroll
      for (int gw = 0; gw < GROUPS_PER_WARP; ++gw) {
        unsigned a[MI][4];
        const unsigned char* a_at = stage + a_frag[gw * K_STEPS + ks];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) ldmatrix_x4(a[mi], a_at + mi * 16 * IGG_ROW_BYTES);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) ig_mma<T>(acc[mi][gw * NI + ni], a[mi], b[gw * NI + ni]);
        }
      }
    }
    read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
  }
  cp_async_wait<0>();  // only empty groups are left; the stages become the epilogue's tile
  __syncthreads();

  // --- epilogue: accumulator (row gq (+8), columns 2 qq (+1)) of each mma tile, + bias, one rounding ----------
  const int gq = lane >> 2, qq = lane & 3;
  if (channels_last_out) {  // tile[row][column], rows 64 + 8 elements apart (the pair stores hit 32 banks)
    constexpr int PITCH = (CHANNELS + 8) * (int)sizeof(T);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int col = warp_col + nt * 8 + 2 * qq, c = c0 + col;
      const float add0 = has_bias && c < channels ? to_acc(bias[c]) : 0.0f;
      const float add1 = has_bias && c + 1 < channels ? to_acc(bias[c + 1]) : 0.0f;
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = warp_m + mi * 16 + gq + 8 * h;
          store_pair<T>(igemm_shared + row * PITCH + col * (int)sizeof(T), acc[mi][nt][2 * h] + add0,
                           acc[mi][nt][2 * h + 1] + add1);
        }
      }
    }
    __syncthreads();
    // thread: vector v of rows row0 + ROW_STEP k, a pixel's 8 vectors on 8 consecutive lanes
    if (!v_inside) return;
    for (int row = row0; row < BM; row += ROW_STEP) {
      const I m = m0 + row;
      if (m >= M) break;
      *reinterpret_cast<uint4*>(out + m * channels + c0 + v * VEC) =
          *reinterpret_cast<const uint4*>(igemm_shared + row * PITCH + v * IG_VECTOR_BYTES);
    }
    return;
  }
  // NCHW: tile[column][row], columns BM elements + 16 bytes apart, then runs of VEC pixels of one channel
  constexpr int PITCH = BM * (int)sizeof(T) + 16;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = warp_col + nt * 8 + 2 * qq + e;
      const float bias_c = has_bias && c0 + col < channels ? to_acc(bias[c0 + col]) : 0.0f;
      T* column = reinterpret_cast<T*>(igemm_shared + col * PITCH);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        column[warp_m + mi * 16 + gq] = from_acc<T>(acc[mi][nt][e] + bias_c);
        column[warp_m + mi * 16 + gq + 8] = from_acc<T>(acc[mi][nt][2 + e] + bias_c);
      }
    }
  }
  __syncthreads();
  if (!vector_store) {  // a thread per pixel, its channels in turn: a warp's stores are 32 consecutive pixels
    for (int row = tid; row < BM; row += IG_THREADS) {
      const I m = m0 + row;
      if (m >= M) break;
      const I image = m / pixels;
      T* at = out + (image * channels + c0) * pixels + (m - image * pixels);
      for (int col = 0; col < CHANNELS && c0 + col < channels; ++col)
        at[(I)col * pixels] = reinterpret_cast<const T*>(igemm_shared + col * PITCH)[row];
    }
    return;
  }
  // vector_store (pixels % VEC == 0 and out 16-byte aligned: a vector lies in one image, aligned): the vector of
  // pixels m0 + mv VEC .. of columns tid / PIXEL_VECTORS + k COLUMN_STEP
  constexpr int PIXEL_VECTORS = BM / VEC, COLUMN_STEP = IG_THREADS / PIXEL_VECTORS;
  static_assert(IG_THREADS % PIXEL_VECTORS == 0, "whole columns per pass");
  const int mv = tid % PIXEL_VECTORS;
  const I m = m0 + mv * VEC, image = m / pixels;
  if (m >= M) return;
  T* at = out + (image * channels + c0) * pixels + (m - image * pixels);
  for (int col = tid / PIXEL_VECTORS; col < CHANNELS && c0 + col < channels; col += COLUMN_STEP) {
    *reinterpret_cast<uint4*>(at + (I)col * pixels) =
        *reinterpret_cast<const uint4*>(igemm_shared + col * PITCH + mv * IG_VECTOR_BYTES);
  }
}

// =================================================================================================================
// Weight gradient of small groups, several a block (issue 24, deliverable 6)
// =================================================================================================================
//
// conv_bwd_weight_igemm gives every group tiles of its own, at least 32 rows d by 64 columns (tap, c): with 16
// channels per group half its rows and a quarter of its columns are padding.  Here, as in conv_fwd_igemm_groups, a
// block covers the 128 bytes of channels c0 .. of GROUPS = CHANNELS / CG consecutive groups of CG channels in and
// out (checked by the planner: `groups_igemm_refusal`), and WGG_TAPS consecutive taps, blockIdx.x of them:
//   A  a K chunk of BK output pixels x the block's CHANNELS output channels of gy_cl (one 16-byte vector a thread);
//   B  the same pixels x WGG_TAPS taps x the block's CHANNELS input channels of x_cl, zero outside the image;
// both k-major and swizzled as conv_bwd_weight_igemm's stages (WgStage: the XOR stays within a tap's 8 vectors).
// Warp w computes group w % GROUPS of the block, taps w / GROUPS + k (4 / GROUPS) of the block's (a 16-bit group of
// 16: both taps; of 32, or TF32's 16: one): its CG rows of A against its group's CG columns of each tap of B, the
// block-diagonal blocks only (no MMA on another group's channels).  The pipeline, the split of K (z) and the float
// sums in partial (splits, D, taps x CG) in (tap, c) order are conv_bwd_weight_igemm's, as is the bias gradient
// (A x ones in the warps of the block's first tap of tap block 0; TF32 adds gy_rest), and so is the end: the last
// split of a tile to arrive (`wg_last_arrival`) adds the splits in order and permutes to grad_weight.
constexpr int WGG_TAPS = 2;

// The warp's fragments at element offset k (the K step's first row) of a stage of rows of `pitch` elements, from
// the lane's row-0 offsets (`at`).  16-bit: A by one ldmatrix.x4.trans; B of n tiles 2 j, 2 j + 1 by one for
// j < NI / 2.  TF32: words of rows k + q and k + q + 4 (the operands are tf32 already: the channels-last copies).
template <typename S>
__device__ __forceinline__ void wgg_a_fragment(unsigned (&a)[4], const S* stage, const int (&at)[2], int k, int) {
  ldmatrix_x4_trans(a, stage + at[0] + k);
}
__device__ __forceinline__ void wgg_a_fragment(unsigned (&a)[4], const float* stage, const int (&at)[2], int k,
                                               int pitch) {
  a[0] = wg_word(stage + at[0] + k);
  a[1] = wg_word(stage + at[1] + k);
  a[2] = wg_word(stage + at[0] + k + 4 * pitch);
  a[3] = wg_word(stage + at[1] + k + 4 * pitch);
}
template <typename S, int NI>
__device__ __forceinline__ void wgg_b_fragments(unsigned (&b)[NI][2], const S* stage, const int (&at)[NI], int k,
                                                int) {
#pragma unroll
  for (int j = 0; j < NI / 2; ++j) {
    unsigned r[4];
    ldmatrix_x4_trans(r, stage + at[j] + k);
    b[2 * j][0] = r[0]; b[2 * j][1] = r[1]; b[2 * j + 1][0] = r[2]; b[2 * j + 1][1] = r[3];
  }
}
template <int NI>
__device__ __forceinline__ void wgg_b_fragments(unsigned (&b)[NI][2], const float* stage, const int (&at)[NI],
                                                int k, int pitch) {
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    b[ni][0] = wg_word(stage + at[ni] + k);
    b[ni][1] = wg_word(stage + at[ni] + k + 4 * pitch);
  }
}
// The bias gradient's K step: bias[mi] += A x a column of ones (TF32: + gy_rest's fragment x ones, from rs).
template <typename S, int MI>
__device__ __forceinline__ void wgg_bias_step(float (&bias)[MI][4], const unsigned (&a)[MI][4], const S*,
                                              const int (&)[MI][2], int, int) {
  const unsigned ones[2] = {pack2<S>(S(1.0f), S(1.0f)), pack2<S>(S(1.0f), S(1.0f))};
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) ig_mma<S>(bias[mi], a[mi], ones);
}
template <int MI>
__device__ __forceinline__ void wgg_bias_step(float (&bias)[MI][4], const unsigned (&a)[MI][4], const float* rs,
                                              const int (&at)[MI][2], int k, int pitch) {
  const unsigned ones[2] = {0x3F800000u, 0x3F800000u};  // 1.0f, exact in tf32
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    unsigned rest[4];
    wgg_a_fragment(rest, rs, at[mi], k, pitch);
    ig_mma<float>(bias[mi], a[mi], ones);
    ig_mma<float>(bias[mi], rest, ones);
  }
}

template <typename T, typename I, int CG>
__global__ void __launch_bounds__(IG_THREADS) conv_bwd_weight_igemm_groups(
    const T* __restrict__ x_cl, const T* __restrict__ gy_cl, const T* __restrict__ gy_rest,
    float* __restrict__ partial, float* __restrict__ bias_partial, T* __restrict__ grad_weight,
    T* __restrict__ grad_bias, int* __restrict__ arrivals, int finish, I n, int groups, int height, int width,
    int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w,
    int out_h, int out_w, I chunks_per_split, int has_bias) {
  typedef WgTile<T> W;
  typedef typename W::S S;
  typedef typename Unsigned<I>::type U;
  constexpr int CHANNELS = IGG_ROW_BYTES / (int)sizeof(T), GROUPS = CHANNELS / CG, WARPS_PER_GROUP = 4 / GROUPS;
  constexpr int WARP_TAPS = WGG_TAPS / WARPS_PER_GROUP, MI = CG / 16, NI = CG / 8;
  constexpr int BK = W::BK, E = W::E, ROW_STEP = IG_THREADS / IGG_ROW_VECTORS, ROWS = BK / ROW_STEP;
  typedef WgStage<S, CHANNELS> SA;
  typedef WgStage<S, WGG_TAPS * CHANNELS> SB;
  static_assert(GROUPS >= 2 && 4 % GROUPS == 0 && WARP_TAPS >= 1 && MI >= 1 && ROWS >= 1 && E * 8 == CHANNELS,
                "tile shape");
  constexpr int A_STAGE = BK * CHANNELS, B_STAGE = BK * WGG_TAPS * CHANNELS;
  constexpr int R_STAGE = sizeof(S) == 4 ? A_STAGE : 0;  // TF32: gy_rest beside A (bias blocks only)
  __shared__ __align__(128) S as[WG_STAGES * (A_STAGE + R_STAGE)];
  __shared__ __align__(128) S bs[WG_STAGES * B_STAGE];
  S* const rs = as + WG_STAGES * A_STAGE;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int taps = kernel_h * kernel_w, C = groups * CG, N = taps * CG;
  const int tap0 = blockIdx.x * WGG_TAPS, c0 = blockIdx.y * CHANNELS;
  const I out_pixels = (I)out_h * out_w, K = n * out_pixels;
  const I k_begin = (I)blockIdx.z * chunks_per_split * BK;
  const I k_end = k_begin + chunks_per_split * BK < K ? k_begin + chunks_per_split * BK : K;
  const int chunks = (int)((k_end - k_begin + BK - 1) / BK);

  // --- copies: vector v (channels c0 + E v ..) of pixel rows row0 + ROW_STEP r, in A and in each tap of B -------
  const int v = tid % IGG_ROW_VECTORS, row0 = tid / IGG_ROW_VECTORS;
  const bool v_inside = c0 + v * E < C;  // past the last group (a block it does not fill): zeros
  const T* a_src = gy_cl + ((k_begin + row0) * C + c0 + v * E);
  const T* r_src = gy_rest + ((k_begin + row0) * C + c0 + v * E);
  const bool stage_rest = sizeof(S) == 4 && has_bias && blockIdx.x == 0;  // (block-uniform)
  const I row_size = (I)width * C, image_size = (I)height * row_size;
  int dy[WGG_TAPS], dx[WGG_TAPS];
  U b_column[WGG_TAPS];
#pragma unroll
  for (int t = 0; t < WGG_TAPS; ++t) {
    const int tap = tap0 + t < taps ? tap0 + t : 0;
    // a tap past the last reads nothing: every y is out of range (the reach is below 2^30)
    dy[t] = tap0 + t < taps ? tap / kernel_w * dilation_h - pad_top : -(1 << 30);
    dx[t] = tap % kernel_w * dilation_w - pad_left;
    b_column[t] = (U)dy[t] * (U)row_size + (U)dx[t] * (U)C + (U)(c0 + v * E);
  }
  const WgSteps<I> steps(BK, out_pixels, out_h, out_w, stride_h, stride_w, row_size, image_size, C);
  WgPixel<I> pixel[ROWS];
  int a_store[ROWS], b_store[ROWS];  // (tap t of B: + t CHANNELS, the swizzle staying within a tap's 8 vectors)
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    pixel[r] = WgPixel<I>::at(k_begin + row0 + r * ROW_STEP, out_pixels, out_w, stride_h, stride_w, row_size,
                              image_size, C);
    a_store[r] = SA::at(row0 + r * ROW_STEP, v * E);
    b_store[r] = SB::at(row0 + r * ROW_STEP, v * E);
  }
  ig_keep_in_register(a_store);
  ig_keep_in_register(b_store);

  I remaining = k_end - k_begin;  // pixels of the split from the next chunk to load on
  auto load_chunk = [&](int stage) {
    S* a_stage = as + stage * A_STAGE;
    S* b_stage = bs + stage * B_STAGE;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const bool inside = v_inside && row0 + r * ROW_STEP < remaining;
      // (a zero-filled copy reads nothing, but gets a pointer into the array all the same)
      cp_async_cg_16(a_stage + a_store[r], inside ? a_src + r * ROW_STEP * C : gy_cl, inside ? 16 : 0);
      if (stage_rest) {
        cp_async_cg_16(rs + stage * R_STAGE + a_store[r], inside ? r_src + r * ROW_STEP * C : gy_rest,
                       inside ? 16 : 0);
      }
      WgPixel<I>& px = pixel[r];
#pragma unroll
      for (int t = 0; t < WGG_TAPS; ++t) {
        const bool b_inside = inside && (unsigned)(px.y + dy[t]) < (unsigned)height &&
                              (unsigned)(px.x + dx[t]) < (unsigned)width;
        cp_async_cg_16(b_stage + b_store[r] + t * CHANNELS,
                       x_cl + (b_inside ? (I)(px.offset + b_column[t]) : (I)0), b_inside ? 16 : 0);
      }
      px.advance(steps);
    }
    a_src += BK * C;
    r_src += BK * C;
    remaining -= BK;
  };

  // --- fragments: the warp's group and taps; element offsets of row 0 (a K step adds its rows) ----------------
  const int block_group = warp % GROUPS, first_tap = warp / GROUPS, col = block_group * CG;
  const int i8 = lane & 7, j4 = lane >> 3, gq = lane >> 2, q = lane & 3;
  int a_frag[MI][2], b_frag[WARP_TAPS][NI];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // 16-bit: ldmatrix.x4.trans rows (h 0 only); float: the words of rows g, g + 8
      a_frag[mi][h] = sizeof(S) == 4 ? SA::at(q, col + mi * 16 + gq + 8 * h)
                      : h == 0       ? SA::at((j4 >> 1) * 8 + i8, col + mi * 16 + (j4 & 1) * 8) : 0;
    }
  }
#pragma unroll
  for (int k = 0; k < WARP_TAPS; ++k) {
    const int tap_col = (first_tap + k * WARPS_PER_GROUP) * CHANNELS + col;
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {  // 16-bit: ldmatrix.x4.trans of n tiles 2 ni', 2 ni' + 1 (ni < NI / 2)
      b_frag[k][ni] = sizeof(S) == 4 ? SB::at(q, tap_col + ni * 8 + gq)
                      : ni < NI / 2  ? SB::at((j4 & 1) * 8 + i8, tap_col + ni * 16 + (j4 >> 1) * 8) : 0;
    }
  }
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) ig_keep_in_register(a_frag[mi]);
#pragma unroll
  for (int k = 0; k < WARP_TAPS; ++k) ig_keep_in_register(b_frag[k]);
  bool warp_tap[WARP_TAPS];  // the warp's taps that exist (warp-uniform)
#pragma unroll
  for (int k = 0; k < WARP_TAPS; ++k) warp_tap[k] = tap0 + first_tap + k * WARPS_PER_GROUP < taps;
  const bool sum_bias = has_bias && blockIdx.x == 0 && first_tap == 0;

  float acc[WARP_TAPS][MI][NI][4], bias_acc[MI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      bias_acc[mi][e] = 0.0f;
#pragma unroll
      for (int k = 0; k < WARP_TAPS; ++k) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) acc[k][mi][ni][e] = 0.0f;
      }
    }
  }

  wg_pipeline(chunks, load_chunk, [&](int read_stage) {
    const S* a_stage = as + read_stage * A_STAGE;
    const S* b_stage = bs + read_stage * B_STAGE;
    const S* r_stage = rs + R_STAGE * read_stage;
#pragma unroll
    for (int k0 = 0; k0 < BK; k0 += W::K_STEP) {
      unsigned a[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) wgg_a_fragment(a[mi], a_stage, a_frag[mi], k0 * CHANNELS, CHANNELS);
#pragma unroll
      for (int k = 0; k < WARP_TAPS; ++k) {
        if (!warp_tap[k]) continue;
        unsigned b[NI][2];
        wgg_b_fragments(b, b_stage, b_frag[k], k0 * WGG_TAPS * CHANNELS, WGG_TAPS * CHANNELS);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) ig_mma<S>(acc[k][mi][ni], a[mi], b[ni]);
        }
      }
      if (sum_bias) wgg_bias_step(bias_acc, a, r_stage, a_frag, k0 * CHANNELS, CHANNELS);
    }
  });

  // --- epilogue: the float sums of this split, (d, (tap, c)) of group g at partial[z][g CG + d][tap CG + c] -----
  // (a group past the last writes nothing, but its warps stay for the barriers of wg_last_arrival)
  const int g = c0 / CG + block_group;
  float* out = partial + ((I)blockIdx.z * C + g * CG) * (I)N;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int d = mi * 16 + gq + 8 * h;
#pragma unroll
      for (int k = 0; k < WARP_TAPS; ++k) {
        if (!warp_tap[k] || g >= groups) continue;
        float* row = out + (I)d * N + (tap0 + first_tap + k * WARPS_PER_GROUP) * CG;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          wg_store_sums(row + ni * 8 + 2 * q, acc[k][mi][ni][2 * h], acc[k][mi][ni][2 * h + 1]);
        }
      }
      if (sum_bias && q == 0 && g < groups) bias_partial[(I)blockIdx.z * C + g * CG + d] = bias_acc[mi][2 * h];
    }
  }

  // --- the last split of the tile to arrive: grad_weight[g CG + d][c][tap] of the block's groups and taps: a
  // thread takes (tap t, channel c) = tid % COLS (the sums' reads coalesce over a tap's CG columns) of every
  // ROWS_APART-th row; the blocks of tap block 0 write grad_bias of the block's channels ------------------------
  // (finish 0: conv_bwd_weight_igemm_finish adds the splits, `weight_igemm_plan`; block-uniform)
  if (!finish) return;
  if (!wg_last_arrival(arrivals, blockIdx.x + gridDim.x * blockIdx.y, reinterpret_cast<int*>(bs))) return;
  constexpr int COLS = WGG_TAPS * CG, ROWS_APART = IG_THREADS / COLS, ELEMS = CHANNELS / ROWS_APART;
  static_assert(IG_THREADS % COLS == 0 && CHANNELS % ROWS_APART == 0, "whole rows of the tile per pass");
  const int cc = tid % CG, tap = tap0 + tid / CG % WGG_TAPS, row = tid / COLS, rows = C - c0 - row;
  const int count = tap < taps && rows > 0 ? min((rows + ROWS_APART - 1) / ROWS_APART, ELEMS) : 0;
  const I first = (I)(c0 + row) * N;
  wg_finish<ELEMS>(partial + first + tap * CG + cc, grad_weight + first + (I)cc * taps + tap, (I)ROWS_APART * N,
                   (I)C * N, (int)gridDim.z, count);
  if (has_bias && blockIdx.x == 0 && tid < CHANNELS) {
    wg_finish<1>(bias_partial + c0 + tid, grad_bias + c0 + tid, (I)0, (I)C, (int)gridDim.z, c0 + tid < C);
  }
}

// =================================================================================================================
// Whole patches a block (issue 24): the 16-bit forward of patch_conv2d at stride 1, x read in its own layout
// =================================================================================================================
//
// patch_fwd_igemm: the forward's GEMM (rows = output pixels, columns = output channels, K = (tap, channel)) for
// x (n, C, H, W) and out (n, D, oH, oW) both C-contiguous, weight (D, C, kH, kW) as the caller has it; stride 1,
// dilation 1, one group, C a multiple of 16 and D of 16 (ops/implicit_gemm.py `patch_igemm_refusal`).  With
// `flipped` set, weight is instead the (C, D, kH, kW) weight of the convolution whose input gradient this is: the
// kernel stages it transposed and with its taps reversed, so that the input gradient at stride 1 (x = grad_output,
// out = grad_input, padding k - 1 - p) runs here with no copy of either (`patch_igemm_grad_input`).  A block
// takes `patches` whole patches at a time (its rows: patches x oH x oW <= PT_ROWS) and loops over the groups of
// patches (persistent blocks, grid-stride), keeping in shared memory:
//
//   weight  D rows of (tap, channel), staged once per block from the (D, C, taps) array (read in its own order,
//           each element stored to its place), each tap's channels padded with zeros to a multiple of PT_STEP;
//           rows an odd number of 16-byte vectors apart, so that the 8 rows of an ldmatrix phase fall in 8
//           different bank groups without a swizzle;
//   raw     two buffers of a group's x, copied as it lies (patches x C x H x W contiguous: 16-byte cp.async, no
//           masks); the next group's lands while this group's MMAs run;
//   tile    the group's pixels as rows of C channels (one row a pixel, padded to PT_STEP channels with zeros, an
//           odd number of vectors apart as above), transposed from raw once per group, and 8 rows of zeros after
//           them: a row in the padding reads the zero row of its own residue mod 8, so that the 8 rows of an
//           ldmatrix phase (8 consecutive pixel rows but for those in the padding) still fall in 8 bank groups;
//   rows    per tap, the byte offset in tile of every GEMM row's input pixel (a zero row where the tap falls in
//           the patch's padding, or past the block's rows), laid out so that a lane reads its 4 rows with one
//           16-byte load: [tap][warp row][lane row (16)][mi (4)];
//   out     the epilogue's tile in out's own layout [patch][channel][pixel] (+ bias, rounded once to T), stored
//           by 16-byte vectors: a patch's channels of the block are contiguous in out (in the group's own raw
//           buffer where a patch's raw x holds its PT_COLS channels of out: the input gradient's).
//
// Every tap reads the same staged tile: a tap is only which rows the lanes point ldmatrix at.  The main loop
// runs over K in steps of one tap x PT_STEP channels (two m16n8k16 a 16 x 8 tile: one load of the rows table
// per 32 mma.sync), 4 warps in 2 x 2 of 64 x 32; output channels past 64 take further passes over the same tile.
// A pass of at most 32 channels (the input gradient of 32 -> 64 channels, the last pass of 80) would leave half
// the MMAs on padding: there the two warps of a warp row split K instead (even and odd steps), each over all 32
// columns, and the odd warp hands its sums to the even one through out_s before the epilogue.
constexpr int PT_ROWS = 128;  // GEMM rows (output pixels) a block: whole patches
constexpr int PT_COLS = 64;   // output channels a pass
constexpr int PT_MI = PT_ROWS / 2 / 16, PT_NI = PT_COLS / 2 / 8;  // a warp's mma tiles: 4 x 4
constexpr int PT_STEP = 32;   // channels of one tap a main-loop step: two k16 mma steps
constexpr int PT_ZERO_ROWS = 8;
constexpr int PT_W_SPREAD = 4;  // rows of the weight's first dim a warp's vector loads take at once (staging)

// Bytes between two rows of `vectors` 16-byte vectors: an odd number of vectors (the bank-group spread above).
__device__ __forceinline__ int pt_pitch(int vectors) { return (vectors | 1) * IG_VECTOR_BYTES; }

// raw [patch][channel][pixel] (patches raw_patch bytes apart, `vectors` x 16 bytes of channels a pixel) -> tile
// [patch pixel][channel], rows `pitch` bytes apart: rows [0, rows) from raw, [rows, rows_to) zeros (the rows past a
// short group: an MMA must not meet a stale value there).  With an even plane (rows and rows_to even) a 4-byte load
// takes a pair of pixels (the pairs along the lanes) and one element pass fills two rows: half the loads of a row
// at a time.
template <typename T>
__device__ __forceinline__ void pt_rows_of(const unsigned char* raw, int raw_patch, int plane, int vectors, int rows,
                                           int rows_to, unsigned char* tile, int pitch) {
  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T);
  typedef typename ClBits<T>::type Bits;
  if (plane % 2 == 0) {
    const int pairs = rows_to / 2, lane = threadIdx.x & 31;
    for (int e = threadIdx.x; e < pairs * vectors; e += blockDim.x) {
      const int cv = e / pairs, r = e % pairs * 2, p = r / plane, pixel = r % plane;
      unsigned w[VEC];
      if (r < rows) {  // the vector's channels lie a plane apart in raw
        const unsigned* from = reinterpret_cast<const unsigned*>(raw + p * raw_patch) + (cv * VEC * plane + pixel) / 2;
#pragma unroll
        for (int i = 0; i < VEC; ++i) w[i] = from[i * plane / 2];
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) w[i] = 0u;
      }
      uint4 lo, hi;  // row r: the low halves of the pairs; row r + 1: the high ones
      lo.x = __byte_perm(w[0], w[1], 0x5410), hi.x = __byte_perm(w[0], w[1], 0x7632);
      lo.y = __byte_perm(w[2], w[3], 0x5410), hi.y = __byte_perm(w[2], w[3], 0x7632);
      lo.z = __byte_perm(w[4], w[5], 0x5410), hi.z = __byte_perm(w[4], w[5], 0x7632);
      lo.w = __byte_perm(w[6], w[7], 0x5410), hi.w = __byte_perm(w[6], w[7], 0x7632);
      // lanes 4-7 of each 8 store row r + 1 first: the 8 rows of a store phase, r0 + {0, 2, 4, 6, 9, 11, 13, 15},
      // fall in 8 different bank groups at an odd pitch (rows r0 + 2 i alone would meet in pairs)
      const bool second = (lane >> 2) & 1;
      *reinterpret_cast<uint4*>(tile + (r + second) * pitch + cv * IG_VECTOR_BYTES) = second ? hi : lo;
      *reinterpret_cast<uint4*>(tile + (r + !second) * pitch + cv * IG_VECTOR_BYTES) = second ? lo : hi;
    }
    return;
  }
  for (int e = threadIdx.x; e < rows_to * vectors; e += blockDim.x) {
    const int cv = e / rows_to, r = e - cv * rows_to;
    Bits b[VEC];
    if (r < rows) {  // the vector's channels lie a plane apart in raw
      const int p = r / plane, pixel = r - p * plane;
      const Bits* from = reinterpret_cast<const Bits*>(raw + p * raw_patch) + cv * VEC * plane + pixel;
#pragma unroll
      for (int i = 0; i < VEC; ++i, from += plane) b[i] = *from;
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) b[i] = Bits(0);
    }
    *reinterpret_cast<uint4*>(tile + r * pitch + cv * IG_VECTOR_BYTES) = cl_pack(b);
  }
}

// The x tile's row that output pixel k of a group (`patches` patches of `plane` input pixels in the tile, then the
// zero rows) reads at `tap`: in the padding, or past the group's output pixels, the zero row of its residue mod 8
// (the 8 rows of an ldmatrix phase stay in 8 bank groups).  patch_fwd_igemm's table and patch_bwd_weight_igemm's.
__device__ __forceinline__ int pt_tap_row(int k, int tap, int patches, int plane, int height, int width, int kernel_w,
                                          int pad_top, int pad_left, int out_w, int out_plane) {
  const int zero = patches * plane;
  if (k >= patches * out_plane) return zero + (k & 7);
  const int p = k / out_plane, pixel = k - p * out_plane;
  const int y = pixel / out_w + tap / kernel_w - pad_top, x = pixel % out_w + tap % kernel_w - pad_left;
  const int row = p * plane + y * width + x;
  return (unsigned)y < (unsigned)height && (unsigned)x < (unsigned)width ? row : zero + (row & 7);
}

template <typename T, typename I>
__global__ void __launch_bounds__(IG_THREADS) patch_fwd_igemm(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    int channels, int out_channels, int height, int width, int kernel_h, int kernel_w, int pad_top, int pad_left,
    int out_h, int out_w, int patches, int has_bias, int flipped) {
  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int C = channels, D = out_channels, taps = kernel_h * kernel_w, plane = height * width;
  const int out_plane = out_h * out_w, rows = patches * plane, cv_count = C / VEC;
  const int padded = (C + PT_STEP - 1) / PT_STEP * PT_STEP, pv_count = padded / VEC;  // a tap's channels staged
  const int w_pitch = pt_pitch(taps * pv_count), a_pitch = pt_pitch(pv_count);
  // a patch's x in raw, 32 bytes apart from the next one's: a warp's 4-byte loads over the pixels of 4 patches
  // of 16 pixels (whose channel planes lie 1 KiB apart for 32 channels) fall in 32 different banks
  const int raw_patch = C * plane * (int)sizeof(T) + 32, raw_bytes = patches * raw_patch;
  // shared memory: weight | rows table | tile (rows + the zero rows) | raw x 2 | out, where out has room of its
  // own: where a patch's raw x holds its out tile (the input gradient's many channels in, few out), out is the
  // group's own raw buffer instead, free once transposed (the next group's x lands in the other one)
  unsigned char* w_s = igemm_shared;
  int* rows_s = reinterpret_cast<int*>(w_s + D * w_pitch);
  unsigned char* tile_s = reinterpret_cast<unsigned char*>(rows_s + taps * PT_ROWS);
  unsigned char* raw_s = tile_s + (rows + PT_ZERO_ROWS) * a_pitch;
  const bool out_in_raw = raw_patch >= PT_COLS * out_plane * (int)sizeof(T);
  const I groups = (n + patches - 1) / patches;

  // --- once per block: the tile's zeros (its zero rows, and every row's channels past C: no transpose writes
  // them; the pitch's odd vector is never read), the rows table, the weight ----------------------------------------
  const int pad_vectors = pv_count - cv_count;
  for (int v = tid; v < PT_ZERO_ROWS * pv_count + rows * pad_vectors; v += IG_THREADS) {
    const int w = v - PT_ZERO_ROWS * pv_count;  // >= 0: a row's padding
    const int r = w < 0 ? rows + v / pv_count : w / pad_vectors, cv = w < 0 ? v % pv_count : cv_count + w % pad_vectors;
    *reinterpret_cast<uint4*>(tile_s + r * a_pitch + cv * IG_VECTOR_BYTES) = make_uint4(0, 0, 0, 0);
  }
  for (int e = tid; e < taps * PT_ROWS; e += IG_THREADS) {
    const int tap = e / PT_ROWS, s = e % PT_ROWS;
    const int m = s / 64 * 64 + (s & 3) * 16 + (s >> 2) % 16;  // [warp row][lane row][mi]
    rows_s[e] = pt_tap_row(m, tap, patches, plane, height, width, kernel_w, pad_top, pad_left, out_w, out_plane) *
                a_pitch;
  }
  // The weight, read in its own order (a warp's loads one contiguous run: 16-byte vectors where it is aligned,
  // else elements; gathering each staged vector's 8 channels a tap apart instead read 8 lines a warp load), each
  // element stored to its (row d, tap, channel c) place: weight (D, C, taps), or flipped (C, D, taps) with the
  // taps mirrored.  A tap's channels past C are zeros.
  typedef typename ClBits<T>::type Bits;
  const Bits* w_bits = reinterpret_cast<const Bits*>(weight);
  const int w_outer = flipped ? D : C, w_first = flipped ? C : D;  // the weight's second and first dims
  auto stage_weight = [&](int e, const Bits* b, int count) {  // elements e .. e + count - 1 (within one `first`:
                                                               // w_outer taps elements are a multiple of VEC)
    const int row = e / taps, first = row / w_outer;
    int t = e - row * taps, second = row - first * w_outer;
#pragma unroll
    for (int i = 0; i < count; ++i) {
      const int d = flipped ? second : first, c = flipped ? first : second, tap = flipped ? taps - 1 - t : t;
      *reinterpret_cast<Bits*>(w_s + d * w_pitch + (tap * padded + c) * (int)sizeof(T)) = b[i];
      if (++t == taps) t = 0, ++second;
    }
  };
  const int w_elements = D * C * taps;  // a multiple of VEC (C is of 16)
  if (reinterpret_cast<size_t>(weight) % IG_VECTOR_BYTES == 0) {
    // Lane l of a warp takes vector l / PT_W_SPREAD (+ the warp's first) of the run of row first + l % PT_W_SPREAD
    // of the weight's first dim (a run: its second dim x taps, whole vectors): the lanes that store element i of
    // their vectors at once then hold PT_W_SPREAD rows' same (second, tap), which lie in different banks of w_s
    // (flipped: consecutive channels, a word a pair; else d rows an odd number of vectors apart).  A warp on one
    // run (flipped: one channel's (d, tap) for 28 d, all in one bank group of 16 bytes a d) stored 6.3 wavefronts
    // a request for the input gradient of 32 -> 64 channels 3x3, 2.5 for its forward; this 1.8 and 1.9, for 6.2
    // lines a warp load instead of 4 (the 64 bytes of 4 runs each).
    const int run = w_elements / VEC / w_first;
    for (int f = tid; f < w_elements / VEC; f += IG_THREADS) {
      const int v = (f / (PT_W_SPREAD * run) * PT_W_SPREAD + f % PT_W_SPREAD) * run + f / PT_W_SPREAD % run;
      const uint4 q = reinterpret_cast<const uint4*>(weight)[v];
      const unsigned words[4] = {q.x, q.y, q.z, q.w};
      Bits b[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) b[i] = Bits(words[i / 2] >> (i % 2 * 16));
      stage_weight(v * VEC, b, VEC);
    }
  } else {
    for (int e = tid; e < w_elements; e += IG_THREADS) stage_weight(e, w_bits + e, 1);
  }
  for (int e = tid; e < D * taps * pad_vectors; e += IG_THREADS) {  // vector (d, tap, cv_count + e % pad_vectors)
    const int k = e / pad_vectors;
    *reinterpret_cast<uint4*>(w_s + k / taps * w_pitch + ((k % taps) * pv_count + cv_count + e % pad_vectors) *
                              IG_VECTOR_BYTES) = make_uint4(0, 0, 0, 0);
  }

  // A group's x, as it lies: its whole patches (the last group's fewer) are one contiguous run of 16-byte vectors.
  auto load_group = [&](I group, int buffer) {
    const I first = group * patches;
    const int count = n - first < (I)patches ? (int)(n - first) : patches;
    const int patch_vectors = C * plane / VEC;
    const unsigned char* src = reinterpret_cast<const unsigned char*>(x + first * C * plane);
    unsigned char* dst = raw_s + buffer * raw_bytes;
    for (int v = tid; v < count * patch_vectors; v += IG_THREADS) {
      const int p = v / patch_vectors;
      cp_async_cg_16(dst + p * raw_patch + (v - p * patch_vectors) * IG_VECTOR_BYTES, src + (I)v * IG_VECTOR_BYTES,
                     IG_VECTOR_BYTES);
    }
  };
  if ((I)blockIdx.x < groups) load_group(blockIdx.x, 0);
  cp_async_commit();

  // --- the lane's fragments: ldmatrix rows (matrix j = lane / 8, its row lane % 8) and epilogue places ---------
  const int warp_m = warp >> 1, warp_n = (warp & 1) * (PT_COLS / 2), j = lane >> 3, jr = lane & 7;
  const int gq = lane >> 2, qq = lane & 3;
  // A: matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15, k hi): the lane's row of
  // rows_s and its k vector (j >> 1) of a 16-channel step
  const int a_table = (warp_m * 16 + (j & 1) * 8 + jr) * 4, a_k = (j >> 1) * IG_VECTOR_BYTES;
  // B (n-major rows): (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi) = b of two n tiles
  const int b_row = (j >> 1) * 8 + jr, b_k = (j & 1) * IG_VECTOR_BYTES;  // from the warp's first column
  int out_at[PT_MI][2];  // the element of out_s (channel 0) of each of the thread's accumulator rows, -1: none
#pragma unroll
  for (int mi = 0; mi < PT_MI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = warp_m * 64 + mi * 16 + gq + 8 * h;
      out_at[mi][h] = m < patches * out_plane ? m / out_plane * PT_COLS * out_plane + m % out_plane : -1;
    }
  }
  const int steps = taps * (padded / PT_STEP);  // the main loop's trips: one tap x PT_STEP channels each
  // The epilogue tile's swizzle, where a channel's row of out_plane pixels is a power of two of 16-byte chunks:
  // chunk k of channel col lies at k ^ pt_swizzle, so that the pair stores of a warp (columns 2 q and 2 q + 1 of 4
  // q, rows 32 or 128 bytes apart for 4x4 and 8x8 patches) fall in 32 different banks; elsewhere none.
  const int out_chunks = out_plane / VEC;
  const bool swizzled = out_plane % VEC == 0 && (out_chunks & (out_chunks - 1)) == 0;
  const int swizzle_mask = swizzled ? (out_chunks < 8 ? out_chunks : 8) - 1 : 0;
  const int swizzle_shift = swizzled && out_chunks < 8 ? 3 - __ffs(out_chunks) + 1 : 0;  // log2(8 / out_chunks)
  auto pt_swizzle = [&](int col) { return ((col >> swizzle_shift) & swizzle_mask) * VEC; };  // in elements

  int buffer = 0;
  for (I group = blockIdx.x; group < groups; group += gridDim.x, buffer ^= 1) {
    cp_async_wait<0>();  // this group's x has landed (this thread's copies) ...
    __syncthreads();     // ... everyone's; the previous group's tile and out are done with
    pt_rows_of<T>(raw_s + buffer * raw_bytes, raw_patch, plane, cv_count, rows, rows, tile_s, a_pitch);
    if (group + gridDim.x < groups) load_group(group + gridDim.x, buffer ^ 1);
    unsigned char* out_s = raw_s + (out_in_raw ? buffer : 2) * raw_bytes;
    cp_async_commit();
    __syncthreads();  // the tile is complete
    const I first = group * patches;
    const int count = n - first < (I)patches ? (int)(n - first) : patches;

    for (int n0 = 0; n0 < D; n0 += PT_COLS) {
      const int cols = D - n0 < PT_COLS ? D - n0 : PT_COLS;
      // at most 32 columns: the warp row's two warps split K (even, odd steps), each over columns 0-31
      const bool split = cols <= PT_COLS / 2, odd_warp = split && (warp & 1);
      const int col0 = n0 + (split ? 0 : warp_n);  // the warp's first column
      // B rows past D read row D - 1 (their columns are not stored)
      const int b0 = col0 + b_row < D ? col0 + b_row : D - 1, b1 = col0 + b_row + 16 < D ? col0 + b_row + 16 : D - 1;
      const unsigned char* b_at0 = w_s + b0 * w_pitch + b_k;
      const unsigned char* b_at1 = w_s + b1 * w_pitch + b_k;
      float acc[PT_MI][PT_NI][4];
#pragma unroll
      for (int mi = 0; mi < PT_MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < PT_NI; ++ni) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
        }
      }
      // --- the main loop: K in steps of one tap x PT_STEP channels ------------------------------------------
      const int tap_bytes = padded * (int)sizeof(T), step_bytes = PT_STEP * (int)sizeof(T);
      const int step0 = odd_warp ? 1 : 0, stride = split ? 2 : 1;
      int table = a_table, k_bytes = 0;  // this step's tap (its rows of rows_s) and channel bytes within the tap
      auto advance = [&](int by) {  // by (1 or 2) steps on: into the next tap where this one's run out (twice: two
                                    // steps over taps of one step), no loop in the main loop
        k_bytes += by * step_bytes;
#pragma unroll
        for (int wrap = 0; wrap < 2; ++wrap) {
          if (k_bytes >= tap_bytes) {
            k_bytes -= tap_bytes;
            table += PT_ROWS;
          }
        }
      };
      advance(step0);
#pragma unroll 1
      for (int step = step0; step < steps; step += stride) {
        const int4 at = *reinterpret_cast<const int4*>(rows_s + table);
        const int a_off[PT_MI] = {at.x, at.y, at.z, at.w};
#pragma unroll
        for (int ks = 0; ks < PT_STEP / 16; ++ks) {  // k16 step ks: 2 vectors of 16 bytes
          unsigned a[PT_MI][4], b[PT_NI][2];
#pragma unroll
          for (int mi = 0; mi < PT_MI; ++mi)
            ldmatrix_x4(a[mi], tile_s + a_off[mi] + k_bytes + ks * 2 * IG_VECTOR_BYTES + a_k);
#pragma unroll
          for (int nj = 0; nj < PT_NI / 2; ++nj) {
            unsigned q[4];
            ldmatrix_x4(q, (nj ? b_at1 : b_at0) + (step * PT_STEP / 16 + ks) * 2 * IG_VECTOR_BYTES);
            b[2 * nj][0] = q[0];
            b[2 * nj][1] = q[1];
            b[2 * nj + 1][0] = q[2];
            b[2 * nj + 1][1] = q[3];
          }
#pragma unroll
          for (int mi = 0; mi < PT_MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < PT_NI; ++ni) ig_mma<T>(acc[mi][ni], a[mi], b[ni]);
          }
        }
        advance(stride);
      }
      if (split) {  // the odd warp's sums to the even one of its warp row, through out_s as floats: row m's 32
                    // columns (128 bytes, within out_s's rows) in 16-byte chunks at chunk ^ 2 (m % 4), so that a
                    // half warp's 8-byte accesses (rows gq 0-3 or 4-7, columns 2 q) fall in 32 different banks
        float* sums = reinterpret_cast<float*>(out_s);
        auto hand_over = [&](bool receive) {  // the odd warp's sums out, or the even one's in
#pragma unroll
          for (int mi = 0; mi < PT_MI; ++mi) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int m = warp_m * 64 + mi * 16 + gq + 8 * h;
#pragma unroll
              for (int ni = 0; ni < PT_NI; ++ni) {
                const int col = ni * 8 + 2 * qq, chunk = (col >> 2) ^ ((m & 3) << 1);  // swizzled as above
                float2* at = reinterpret_cast<float2*>(sums + m * (PT_COLS / 2) + chunk * 4 + (col & 3));
                if (out_at[mi][h] < 0) continue;  // a row past the group's: neither stored nor in out_s
                if (receive) {  // one 8-byte load, as the pair was stored (two 4-byte ones: twice the wavefronts)
                  const float2 sum = *at;
                  acc[mi][ni][2 * h] += sum.x;
                  acc[mi][ni][2 * h + 1] += sum.y;
                } else {
                  *at = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                }
              }
            }
          }
        };
        if (odd_warp) hand_over(false);
        __syncthreads();
        if (!odd_warp) hand_over(true);
        __syncthreads();  // out_s is the epilogue's again
      }
      // --- epilogue: out_s [patch][channel][pixel] = T(acc + bias), then 16-byte stores of whole patches -------
      // A thread's pair (columns col, col + 1 of row m) is rounded and packed; with an even out_plane the lanes
      // of rows gq and gq ^ 1 swap halves (one shuffle), so that each stores a pair of pixels (m, m + 1) of one
      // column as 4 bytes: the even row's lane column col, the odd row's column col + 1.
      T* out_t = reinterpret_cast<T*>(out_s);
      const bool pixel_pairs = (out_plane & 1) == 0, odd_row = gq & 1;
      if (!odd_warp) {  // (the odd warp's sums are in the even one's)
#pragma unroll
        for (int ni = 0; ni < PT_NI; ++ni) {
          const int col = col0 - n0 + ni * 8 + 2 * qq;
          const float add0 = has_bias && n0 + col < D ? to_acc(bias[n0 + col]) : 0.0f;
          const float add1 = has_bias && n0 + col + 1 < D ? to_acc(bias[n0 + col + 1]) : 0.0f;
#pragma unroll
          for (int mi = 0; mi < PT_MI; ++mi) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const T lo = from_acc<T>(acc[mi][ni][2 * h] + add0), hi = from_acc<T>(acc[mi][ni][2 * h + 1] + add1);
              const int at = out_at[mi][h];
              if (pixel_pairs) {
                const unsigned mine = pack2<T>(lo, hi), other = __shfl_xor_sync(0xffffffffu, mine, 4);
                const unsigned pair = odd_row ? __byte_perm(other, mine, 0x7632) : __byte_perm(mine, other, 0x5410);
                if (at >= 0)
                  *reinterpret_cast<unsigned*>(out_t + (odd_row ? ((at - 1) ^ pt_swizzle(col + 1)) + (col + 1) * out_plane
                                                                : (at ^ pt_swizzle(col)) + col * out_plane)) = pair;
              } else if (at >= 0) {
                out_t[at + col * out_plane] = lo;
                out_t[at + (col + 1) * out_plane] = hi;
              }
            }
          }
        }
      }
      __syncthreads();
      // patch p's channels n0 .. n0 + cols - 1 are cols x out_plane contiguous elements of out (its vector w is
      // chunk w % out_chunks of channel w / out_chunks: swizzled in out_s where the swizzle applies)
      const int patch_vectors = cols * out_plane / VEC;
      for (int v = tid; v < count * patch_vectors; v += IG_THREADS) {
        const int p = v / patch_vectors, w = v % patch_vectors;
        const int at = swizzled ? w * VEC ^ pt_swizzle(w / out_chunks) : w * VEC;
        *reinterpret_cast<uint4*>(out + ((first + p) * D + n0) * out_plane + (I)w * VEC) =
            *reinterpret_cast<const uint4*>(out_s + (p * PT_COLS * out_plane + at) * (int)sizeof(T));
      }
      __syncthreads();  // out_s is free for the next pass
    }
  }
  cp_async_wait<0>();
}

// =================================================================================================================
// Whole patches a block, the weight gradient (issue 24, deliverable 5): the 16-bit grad_weight of patch_conv2d
// =================================================================================================================
//
// patch_bwd_weight_igemm: grad_weight as the GEMM rows = output channels d, columns = units of one tap x 16
// channels, K = every output pixel, with x (n, C, H, W) and grad_output (n, D, oH, oW) both C-contiguous and read
// as they lie: no channels-last copy of either.  The conditions are the forward's (`patch_igemm_refusal`: stride 1,
// dilation 1, one group, C and D multiples of 16, 32-bit indices).  Unit u is (channel slice u / taps, tap u % taps),
// so that a block's units need only one or two slices of x's channels where taps >= 8 (3x3: 9 units a slice).
//
// A block owns one tile of grad_weight: PW_ROWS output channels x `tile_units` units (at most PW_UNITS), blockIdx.y
// (d tile, unit tile), and one split of the groups of `patches` whole patches, blockIdx.x: groups x, x + gridDim.x,
// ... (a shape-only assignment, `plan_patch_weight`).  Per group it copies, as they lie (16-byte cp.async, double
// buffered as in patch_fwd_igemm: the next group's lands during this one's MMAs), its patches' channels of x and its
// output channels of grad_output:
//   x tile   a row per input pixel of the staged channels (transposed from the raw copy once a group by
//            `pt_rows_of`), 8 zero rows after them, an odd number of vectors apart (pt_pitch); a tap reads it
//            through the rows table as the forward does (the same layout: padding and rows past the group read a
//            zero row of their own residue mod 8);
//   dy tile  grad_output in chunks of 8 output pixels (K) of one output channel d, the chunk rows (K / 8) PW_ROWS
//            chunks wide (`pw_dy_pitch` apart): A's rows as ldmatrix reads them without a transpose.  Where a
//            patch's output pixels are whole chunks (oH oW a multiple of 8) cp.async copies each chunk of
//            grad_output straight to its place (two tiles, double buffered; no transpose); else into raw buffers as
//            x, and `pw_chunks_of` gathers the chunks into one tile.  Chunks past the group's pixels, and the
//            channels past D, are zeros.
// The MMAs run over the group's pixels in steps of 16: A (d x pixels) by ldmatrix of the dy tile, B (pixels x
// channels of a unit) by ldmatrix .trans of the x rows the unit's tap points at.  4 warps: 2 warp rows of 32 d,
// each over all the tile's units, the two warps of a row splitting K (every other 4-step trip of the block's,
// counted across its groups): each A fragment is loaded by one warp only (split by units instead, both warps of a
// row loaded the same A).  After the last group the odd warp hands its sums to the even one through shared memory
// (`hand_over`), which adds them to its own and stores.  The bias gradient (has_bias) is A times a column of
// ones, summed in the same trips by the blocks of the first unit tile.  Each block writes its float sums once, to
// its split's slice of partial (splits, D, taps x C, (tap, c) order) and bias_partial (splits, D);
// conv_bwd_weight_igemm_finish adds the splits in order and rounds once (the same bits on every run).
constexpr int PW_ROWS = 64;                   // output channels a block
constexpr int PW_UNITS = 6;                   // units (one tap x 16 channels) a block at most, all in every warp
constexpr int PW_K_ROWS = PT_ROWS;            // output pixels a group at most (the rows table's, a tap)
constexpr int PW_CHUNK = 8;                   // output pixels a chunk of the dy tile: 16 bytes
constexpr int PW_HAND_VALUES = 2 * 4 * (2 * PW_UNITS + 1);  // a lane's sums: acc[2][2 PW_UNITS][4], bias_acc[2][4]

// Bytes between two chunk rows of the dy tile: PW_ROWS chunks and a pad, so that both its writers and ldmatrix meet
// 8 bank groups in each 8 chunks they touch.  ldmatrix reads 8 channels of one chunk row (any pad); cp.async writes
// 8 consecutive chunks of grad_output, channel d's chunks c, c + 1, ... of a patch (c < oc = oH oW / 8) and then
// d + 1's: at chunk row c, column d, in bank group (c pad + d) mod 8, all 8 different for a pad of 8 / oc (oc = 1,
// 2, 4) or an odd one (oc a multiple of 8); other oc meet in some pairs.
__device__ __forceinline__ int pw_dy_pitch(int out_plane) {
  const int oc = out_plane / PW_CHUNK;
  const bool spread = out_plane % PW_CHUNK == 0 && oc < 8 && (oc & (oc - 1)) == 0;
  return (PW_ROWS + (spread ? 8 / oc : 1)) * IG_VECTOR_BYTES;
}

// raw [patch][channel d][pixel] (patches raw_patch bytes apart, `plane` pixels a patch) -> the dy tile's chunks
// (chunk row kc, channel d: output pixels 8 kc .. 8 kc + 7 of the group, across patches) for chunk rows [0,
// chunks_to) and channels [0, channels): pixels past k_rows zeros.  The oH oW that is not whole chunks only.
template <typename T>
__device__ __forceinline__ void pw_chunks_of(const unsigned char* raw, int raw_patch, int plane, int channels,
                                             int k_rows, int chunks_to, unsigned char* tile, int pitch) {
  typedef typename ClBits<T>::type Bits;
  for (int e = threadIdx.x; e < chunks_to * channels; e += blockDim.x) {
    const int kc = e / channels, d = e - kc * channels, k0 = kc * PW_CHUNK;
    int p = k0 / plane, pixel = k0 - p * plane;
    Bits b[PW_CHUNK];
#pragma unroll
    for (int i = 0; i < PW_CHUNK; ++i) {
      b[i] = k0 + i < k_rows ? reinterpret_cast<const Bits*>(raw + p * raw_patch)[d * plane + pixel] : Bits(0);
      if (++pixel == plane) pixel = 0, ++p;
    }
    *reinterpret_cast<uint4*>(tile + kc * pitch + d * IG_VECTOR_BYTES) = cl_pack(b);
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(IG_THREADS) patch_bwd_weight_igemm(
    const T* __restrict__ x, const T* __restrict__ grad_out, float* __restrict__ partial,
    float* __restrict__ bias_partial, I n, int channels, int out_channels, int height, int width, int kernel_h,
    int kernel_w, int pad_top, int pad_left, int out_h, int out_w, int patches, int tile_units, int has_bias) {
  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int C = channels, D = out_channels, taps = kernel_h * kernel_w, plane = height * width;
  const int out_plane = out_h * out_w, units = C / 16 * taps, unit_tiles = (units + tile_units - 1) / tile_units;
  const int u0 = blockIdx.y % unit_tiles * tile_units, u_end = min(u0 + tile_units, units);
  const int m0 = blockIdx.y / unit_tiles * PW_ROWS, rows_d = min(PW_ROWS, D - m0);
  const int slice0 = u0 / taps, x_channels = ((u_end - 1) / taps + 1 - slice0) * 16;  // the channels staged
  const int x_vectors = x_channels / VEC, x_pitch = pt_pitch(x_vectors);
  const int x_rows = patches * plane;
  // the dy tile: chunk rows for the group's output pixels rounded up to whole K steps of 16; copied to directly
  // where a patch's output pixels are whole chunks (oc of them), else gathered from raw buffers
  const bool direct = out_plane % PW_CHUNK == 0;
  const int oc = out_plane / PW_CHUNK, dy_pitch = pw_dy_pitch(out_plane);
  const int dy_tile = (patches * out_plane + 15) / 16 * 2 * dy_pitch;
  // raw buffers: a patch's staged channels (or output channels), 32 bytes apart from the next one's (as the forward)
  const int x_patch = x_channels * plane * (int)sizeof(T) + 32, dy_patch = rows_d * out_plane * (int)sizeof(T) + 32;
  // shared memory: rows table | x tile (rows + the zero rows) | dy tile (2 if direct) | raw x 2 | raw dy 2 (if not)
  int* rows_s = reinterpret_cast<int*>(igemm_shared);
  unsigned char* x_s = reinterpret_cast<unsigned char*>(rows_s + taps * PW_K_ROWS);
  unsigned char* dy_s = x_s + (x_rows + PT_ZERO_ROWS) * x_pitch;
  unsigned char* x_raw = dy_s + (direct ? 2 : 1) * dy_tile;
  unsigned char* dy_raw = x_raw + 2 * patches * x_patch;
  const I groups = (n + patches - 1) / patches;

  // --- once per block: both tiles zeroed (the zero rows, the dy channels past D), the rows table ----------------
  for (int v = tid; v < ((x_rows + PT_ZERO_ROWS) * x_pitch + (direct ? 2 : 1) * dy_tile) / IG_VECTOR_BYTES;
       v += IG_THREADS)
    *reinterpret_cast<uint4*>(x_s + v * IG_VECTOR_BYTES) = make_uint4(0, 0, 0, 0);
  // [tap][quad of K steps][lane (32)][pair of steps of the quad (2)]: a lane reads its row of each pair with one
  // 8-byte load (2 wavefronts; 16-byte loads of 4 steps' rows, lanes 16-31 the same as 0-15, took 4)
  for (int e = tid; e < taps * PW_K_ROWS; e += IG_THREADS) {
    const int tap = e / PW_K_ROWS, i = e % PW_K_ROWS, k = i / 64 * 64 + i % 2 * 32 + i % 64 / 2;
    rows_s[e] = pt_tap_row(k, tap, patches, plane, height, width, kernel_w, pad_top, pad_left, out_w, out_plane) *
                x_pitch;
  }
  __syncthreads();  // the dy tiles are zero before cp.async writes into them

  // A group's patches: their staged channels of x and output channels of grad_output, each a contiguous run of
  // 16-byte vectors a patch.
  auto load_group = [&](I group, int buffer) {
    const I first = group * patches;
    const int count = n - first < (I)patches ? (int)(n - first) : patches;
    const int xv = x_channels * plane / VEC, dv = rows_d * out_plane / VEC;
    for (int v = tid; v < count * xv; v += IG_THREADS) {
      const int p = v / xv;
      cp_async_cg_16(x_raw + (buffer * patches + p) * x_patch + (v - p * xv) * IG_VECTOR_BYTES,
                     x + ((first + p) * C + slice0 * 16) * plane + (I)(v - p * xv) * VEC, IG_VECTOR_BYTES);
    }
    for (int v = tid; v < count * dv; v += IG_THREADS) {
      const int p = v / dv, w = v - p * dv, d = direct ? w / oc : 0;  // (d, chunk w - d oc) of patch p
      cp_async_cg_16(direct ? dy_s + buffer * dy_tile + (p * oc + w - d * oc) * dy_pitch + d * IG_VECTOR_BYTES
                            : dy_raw + (buffer * patches + p) * dy_patch + w * IG_VECTOR_BYTES,
                     grad_out + ((first + p) * D + m0) * out_plane + (I)w * VEC, IG_VECTOR_BYTES);
    }
  };
  if ((I)blockIdx.x < groups) load_group(blockIdx.x, 0);
  cp_async_commit();

  // --- the lane's fragments (ldmatrix: matrix j = lane / 8, its row lane % 8) ----------------------------------
  const int wm = (warp >> 1) * 32, odd_warp = warp & 1, j = lane >> 3, jr = lane & 7;
  // A (d x pixels from the chunks): matrices (d 0-7, k 0-7), (d 8-15, k 0-7), (d 0-7, k 8-15), (d 8-15, k 8-15)
  const int a_at = (j >> 1) * dy_pitch + (wm + (j & 1) * 8 + jr) * IG_VECTOR_BYTES;
  // B (.trans of [pixel][channel]) of a pair of K steps: one ldmatrix of the unit's channels 0-7 over the pair's
  // 32 pixel rows (k 0-7, 8-15 of the first step, of the second), one of channels 8-15: the b of the unit's two n
  // tiles for both steps, every lane on a row of its own.  Per unit: its tap's rows (this lane's row of each pair)
  // and its channels' bytes.
  const int* b_rows[PW_UNITS];
  int b_bytes[PW_UNITS];
  bool b_unit[PW_UNITS];
#pragma unroll
  for (int t = 0; t < PW_UNITS; ++t) {
    const int u = u0 + t;
    b_unit[t] = u < u_end;
    const int tap = b_unit[t] ? u % taps : 0;
    b_rows[t] = rows_s + tap * PW_K_ROWS + lane * 2;
    b_bytes[t] = ((b_unit[t] ? u / taps : slice0) - slice0) * 16 * (int)sizeof(T);
  }
  const bool sum_bias = has_bias && u0 == 0;  // block-uniform
  float acc[2][2 * PW_UNITS][4], bias_acc[2][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      bias_acc[mi][e] = 0.0f;
#pragma unroll
      for (int ni = 0; ni < 2 * PW_UNITS; ++ni) acc[mi][ni][e] = 0.0f;
    }
  }
  const T one = T(1.0f);
  const unsigned ones[2] = {pack2<T>(one, one), pack2<T>(one, one)};

  int buffer = 0, trips = 0;  // trips: the block's 4-step trips so far, over its groups (odd ones: the odd warps')
  for (I group = blockIdx.x, next; group < groups; group = next, buffer ^= 1) {
    cp_async_wait<0>();  // this group's copies have landed (this thread's) ...
    __syncthreads();     // ... everyone's; the previous group's tiles are no longer read
    next = group + gridDim.x;  // (the next group's buffers were last read before the previous group's barrier)
    if (next < groups) load_group(next, buffer ^ 1);
    cp_async_commit();
    const I first = group * patches;
    const int count = n - first < (I)patches ? (int)(n - first) : patches, k_rows = count * out_plane;
    const int steps = (k_rows + 15) / 16;
    pt_rows_of<T>(x_raw + buffer * patches * x_patch, x_patch, plane, x_vectors, count * plane, x_rows, x_s, x_pitch);
    const unsigned char* a_tile = dy_s + (direct ? buffer : 0) * dy_tile;
    if (!direct) {
      pw_chunks_of<T>(dy_raw + buffer * patches * dy_patch, dy_patch, out_plane, rows_d, k_rows, steps * 2, dy_s,
                      dy_pitch);
    } else if (count * oc % 2) {  // the last step's second chunk row: past the group's pixels (a short group)
      for (int d = tid; d < rows_d; d += IG_THREADS)
        *reinterpret_cast<uint4*>(dy_s + buffer * dy_tile + count * oc * dy_pitch + d * IG_VECTOR_BYTES) =
            make_uint4(0, 0, 0, 0);
    }
    __syncthreads();  // the tiles are complete
#pragma unroll 1
    for (int quad = 0; quad * 4 < steps; ++quad) {  // 4 K steps a trip: a unit's rows of them in one load
      if ((trips++ & 1) != odd_warp) continue;  // the other warp of the row's trip
      int rows[PW_UNITS][2];
#pragma unroll
      for (int t = 0; t < PW_UNITS; ++t) {
        if (!b_unit[t]) continue;
        const int2 r = *reinterpret_cast<const int2*>(b_rows[t] + quad * 64);
        rows[t][0] = r.x, rows[t][1] = r.y;
      }
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int step = quad * 4 + 2 * pair;
        if (step >= steps) break;
        const int in_pair = step + 1 < steps ? 2 : 1;  // (an odd last step: its B loads read the next one's rows,
                                                       // zero or a short group's, whose MMAs never run)
        unsigned a[2][2][4];  // [step of the pair][mi]
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            if (s < in_pair)
              ldmatrix_x4(a[s][mi], a_tile + a_at + (step + s) * 2 * dy_pitch + mi * 16 * IG_VECTOR_BYTES);
          }
        }
#pragma unroll
        for (int t = 0; t < PW_UNITS; ++t) {
          if (!b_unit[t]) continue;
          unsigned lo[4], hi[4];  // channels 0-7, 8-15: (k 0-7, k 8-15) of the first step, then of the second
          ldmatrix_x4_trans(lo, x_s + rows[t][pair] + b_bytes[t]);
          ldmatrix_x4_trans(hi, x_s + rows[t][pair] + b_bytes[t] + IG_VECTOR_BYTES);
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            if (s >= in_pair) break;
            const unsigned b0[2] = {lo[2 * s], lo[2 * s + 1]}, b1[2] = {hi[2 * s], hi[2 * s + 1]};
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
              mma_m16n8k16<T>(acc[mi][2 * t], a[s][mi], b0);
              mma_m16n8k16<T>(acc[mi][2 * t + 1], a[s][mi], b1);
            }
          }
        }
        if (sum_bias) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
              if (s < in_pair) mma_m16n8k16<T>(bias_acc[mi], a[s][mi], ones);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  // The odd warp's sums (acc, then bias_acc) to the even one of its warp row, over the tiles (no warp reads them
  // after the first barrier): value e of a lane at hand[warp row][e][lane], each access of a warp 32 consecutive
  // words (one wavefront): 2 x PW_HAND_VALUES x 32 floats of shared memory (the planner's PW_HAND_BYTES).
  float* hand = reinterpret_cast<float*>(igemm_shared) + (warp >> 1) * PW_HAND_VALUES * 32 + lane;
  auto hand_over = [&](bool receive) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int ni = 0; ni <= 2 * PW_UNITS; ++ni) {  // ni = 2 PW_UNITS: the bias
          float& value = ni < 2 * PW_UNITS ? acc[mi][ni][e] : bias_acc[mi][e];
          float* at = hand + ((mi * 4 + e) * (2 * PW_UNITS + 1) + ni) * 32;
          if (receive) value += *at;
          else *at = value;
        }
      }
    }
  };
  __syncthreads();
  if (odd_warp) hand_over(false);
  __syncthreads();
  if (odd_warp) return;
  hand_over(true);

  // --- the split's float sums: (d, (tap, c)) at partial[z][d][tap C + c], d at bias_partial[z][d] -----------------
  const int gq = lane >> 2, qq = lane & 3, N = taps * C;
  float* out = partial + (I)blockIdx.x * D * N;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int d = wm + mi * 16 + gq + 8 * h;
      if (d >= rows_d) continue;
#pragma unroll
      for (int t = 0; t < PW_UNITS; ++t) {
        if (!b_unit[t]) continue;
        const int u = u0 + t, column = u % taps * C + u / taps * 16 + 2 * qq;
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          wg_store_sums(out + (I)(m0 + d) * N + column + ni * 8, acc[mi][2 * t + ni][2 * h],
                        acc[mi][2 * t + ni][2 * h + 1]);
        }
      }
      if (sum_bias && qq == 0) bias_partial[(I)blockIdx.x * D + m0 + d] = bias_acc[mi][2 * h];
    }
  }
}
