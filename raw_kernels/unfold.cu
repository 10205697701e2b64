// unfold (im2col) and fold (col2im) over a flat batch of planes x (n, C, H, W).
//
// cols holds rows ordered (c, i, j) of L = oH * oW pixels each.  fold reads torch's layout
// (n, C * kH * kW, L); unfold writes any layout whose pixels are contiguous, given the distance between
// images and between rows: torch's, or (C * kH * kW, n, L), where each group's rows form one matrix over
// n * L for the weight-gradient GEMM.
//
// Both kernels are pure data movement, so they are written for the memory system: consecutive threads take
// consecutive pixels of the contiguous dimension (the pixels of a cols row, the x of an output row), so every
// load and store of a warp is one coalesced request; a thread's flat index is split into its coordinates once
// (fast division, not per tap), and the tap loops only step pointers and compare.
#include "common.cuh"

// FOLD_PLANES: the planes (image, channel) each thread of fold_col2im sums, from cupyconv/ops/unfold.py.
#if !defined(FOLD_PLANES)
#error "unfold.cu needs the -D options of cupyconv._device.compile_options('unfold.cu')"
#endif

// One thread per (image, channel, output pixel) window: it copies the window's kH * kW taps, so the index
// arithmetic is paid once per window, not once per tap.  Consecutive threads take consecutive output pixels,
// so every store of a tap is coalesced, and so is every load where stride_w * x_stride_w is 1 (a stride or a
// dilation only spreads the loads).  x is read through element strides (any layout, negative included).
template <typename T, typename I>
__device__ __forceinline__ void unfold_windows(const T* __restrict__ x, T* __restrict__ cols, I n,
                              I x_stride_n, I x_stride_c, I x_stride_h, I x_stride_w,
                              I cols_stride_image, I cols_stride_row,
                              int channels, int height, int width, int kernel_h, int kernel_w,
                              int stride_h, int stride_w, int pad_top, int pad_left,
                              int dilation_h, int dilation_w, int out_h, int out_w,
                              unsigned int out_w_magic, unsigned int out_h_magic, unsigned int channels_magic) {
  const I pixels = (I)out_h * out_w;
  const I windows = n * channels * pixels;
  const FastDivmod by_out_w(out_w, out_w_magic), by_out_h(out_h, out_h_magic), by_channels(channels, channels_magic);
  const T zero = from_acc<T>(acc_t<T>(0));
  const I tap_step = dilation_w * x_stride_w;  // from one tap of a window row to the next, in x
  for (I index = grid_start<I>(); index < windows; index += grid_stride<I>()) {
    int ox, oy, c;
    const I row = index_divmod<I>(index, by_out_w, ox);     // image * channels * out_h + channel * out_h + oy
    const I plane = index_divmod<I>(row, by_out_h, oy);     // image * channels + channel
    const I image = index_divmod<I>(plane, by_channels, c);
    const T* src = x + image * x_stride_n + c * x_stride_c;
    T* dst = cols + image * cols_stride_image + (I)c * kernel_h * kernel_w * cols_stride_row + (I)oy * out_w + ox;
    const int x0 = ox * stride_w - pad_left;
    int y = oy * stride_h - pad_top;
    for (int i = 0; i < kernel_h; ++i, y += dilation_h) {
      const bool row_inside = y >= 0 && y < height;
      const T* tap = src + y * x_stride_h + x0 * x_stride_w;  // tap (i, 0); stepped, not recomputed, per j
      int xx = x0;
      // Not unrolled: the loop is a few instructions per tap, with no remainder copy of it.
#pragma unroll 1
      for (int j = 0; j < kernel_w; ++j, xx += dilation_w, tap += tap_step, dst += cols_stride_row) {
        T value = zero;
        if (row_inside && xx >= 0 && xx < width) value = *tap;
        *dst = value;
      }
    }
  }
}

// Raw bits of one element: unfold is a copy, so its vector path moves bits, whatever the type.
template <int Bytes> struct BitsOf;
template <> struct BitsOf<2> { typedef unsigned short type; };
template <> struct BitsOf<4> { typedef unsigned int type; };
template <> struct BitsOf<8> { typedef unsigned long long type; };

__device__ __forceinline__ uint4 words4(unsigned a, unsigned b, unsigned c, unsigned d) {
  uint4 v;
  v.x = a; v.y = b; v.z = c; v.w = d;
  return v;
}

// The 16-byte vector of V = 16 / sizeof(E) elements e[0..V), as four 32-bit words.
template <typename E>
__device__ __forceinline__ uint4 pack_words(const E (&e)[16 / sizeof(E)]) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (sizeof(E) == 2) w[k] = (unsigned)e[2 * k] | ((unsigned)e[2 * k + 1] << 16);
    else if constexpr (sizeof(E) == 4) w[k] = e[k];
    else w[k] = (unsigned)(e[k / 2] >> (32 * (k % 2)));
  }
  return words4(w[0], w[1], w[2], w[3]);
}

// The 16 bytes that start `bytes` (0..15) bytes into the 32 of lo, hi: hi's words follow lo's.
__device__ __forceinline__ uint4 window16(uint4 lo, uint4 hi, int bytes) {
  const unsigned shift = 8 * (bytes & 3);
  unsigned a[5];
  switch (bytes >> 2) {  // uniform over a warp: every lane's window starts as far into its vectors
    case 0: a[0] = lo.x; a[1] = lo.y; a[2] = lo.z; a[3] = lo.w; a[4] = hi.x; break;
    case 1: a[0] = lo.y; a[1] = lo.z; a[2] = lo.w; a[3] = hi.x; a[4] = hi.y; break;
    case 2: a[0] = lo.z; a[1] = lo.w; a[2] = hi.x; a[3] = hi.y; a[4] = hi.z; break;
    default: a[0] = lo.w; a[1] = hi.x; a[2] = hi.y; a[3] = hi.z; a[4] = hi.w; break;
  }
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = (unsigned)((((unsigned long long)a[k + 1] << 32) | a[k]) >> shift);
  return words4(w[0], w[1], w[2], w[3]);
}

// The 16-byte vector of row elements start .. start + V - 1 (start a multiple of V), or zeros where it lies in the
// padding (start < 0 or past the row's end).
template <typename E>
__device__ __forceinline__ uint4 load_or_zero(const E* row, int start, int width) {
  constexpr int V = 16 / sizeof(E);
  return start >= 0 && start + V <= width ? *reinterpret_cast<const uint4*>(row + start) : words4(0u, 0u, 0u, 0u);
}

// unfold with 16-byte loads and stores, for the common layout (host-checked in ops/unfold.py: unit stride
// along x, contiguous input rows, every stride of x and cols a multiple of V = 16 / sizeof(T) elements, out_w too,
// both arrays 16-byte aligned).  One thread per run of V output pixels of one output row: consecutive threads take
// consecutive runs, so a warp stores 512 contiguous bytes per tap.  The V inputs of a tap are input pixels
// xx .. xx + V - 1 of one row, at the same offset xx mod V for every lane: two aligned 16-byte loads and a
// funnel shift (a vector in the padding is zeros); where width is not a multiple of V, the lanes whose vectors
// cross the row's end copy element by element.
template <typename T, typename I>
__device__ __forceinline__ void unfold_runs(const T* __restrict__ x, T* __restrict__ cols, I n,
                                  I x_stride_n, I x_stride_c, I x_stride_h,
                                  I cols_stride_image, I cols_stride_row,
                                  int channels, int height, int width, int kernel_h, int kernel_w,
                                  int stride_h, int pad_top, int pad_left, int dilation_h, int dilation_w,
                                  int out_h, int out_w, unsigned int runs_magic, unsigned int out_h_magic,
                                  unsigned int channels_magic) {
  typedef typename BitsOf<sizeof(T)>::type E;
  constexpr int V = 16 / sizeof(T);
  const E* bits = reinterpret_cast<const E*>(x);
  const int runs_per_row = out_w / V;
  const I units = n * channels * out_h * runs_per_row;
  const FastDivmod by_runs(runs_per_row, runs_magic), by_out_h(out_h, out_h_magic);
  const FastDivmod by_channels(channels, channels_magic);
  for (I index = grid_start<I>(); index < units; index += grid_stride<I>()) {
    int run, oy, c;
    const I row = index_divmod<I>(index, by_runs, run);
    const I plane = index_divmod<I>(row, by_out_h, oy);
    const I image = index_divmod<I>(plane, by_channels, c);
    const int ox0 = run * V;
    const E* src = bits + image * x_stride_n + c * x_stride_c;
    T* dst = cols + image * cols_stride_image + (I)c * kernel_h * kernel_w * cols_stride_row + (I)oy * out_w + ox0;
    int y = oy * stride_h - pad_top;
    for (int i = 0; i < kernel_h; ++i, y += dilation_h) {
      const bool row_inside = y >= 0 && y < height;
      const E* src_row = src + y * x_stride_h;
      int xx = ox0 - pad_left;
      // The vectors at lo_start and lo_start + V (hi, where has_hi) of this row, kept from tap to tap: with a small
      // dilation the next tap starts in the same vector or the next one, so a tap loads about one vector.
      uint4 lo = words4(0u, 0u, 0u, 0u), hi = lo;
      int lo_start = -2 * V;  // none loaded yet: a vector this far left is padding, whose zeros lo holds
      bool has_hi = false;
#pragma unroll 1
      for (int j = 0; j < kernel_w; ++j, xx += dilation_w, dst += cols_stride_row) {
        const int start = xx & ~(V - 1);  // the aligned vector holding input pixel xx (xx may be negative)
        const int offset = xx - start;
        uint4 value = words4(0u, 0u, 0u, 0u);
        if (row_inside) {
          // Vectors start at multiples of V, so each lies wholly inside the row or wholly in its padding (zeros),
          // unless it holds the row's end where width is not a multiple of V: those lanes copy element by element.
          if ((width & (V - 1)) == 0 || start + (offset ? 2 * V : V) <= width) {
            if (start != lo_start) {
              lo = has_hi && start == lo_start + V ? hi : load_or_zero(src_row, start, width);
              lo_start = start;
              has_hi = false;
            }
            if (offset && !has_hi) {
              hi = load_or_zero(src_row, start + V, width);
              has_hi = true;
            }
            value = window16(lo, hi, offset * (int)sizeof(T));
          } else {  // a vector across the row's end
            E e[V];
#pragma unroll
            for (int k = 0; k < V; ++k) e[k] = xx + k >= 0 && xx + k < width ? src_row[xx + k] : E(0);
            value = pack_words<E>(e);
          }
        }
        *reinterpret_cast<uint4*>(dst) = value;
      }
    }
  }
}

// im2col: RUN = 1, one thread per window (`unfold_windows`, any layout), or RUN = 16 / sizeof(T), one thread per
// run of RUN output pixels with 16-byte accesses (`unfold_runs`, the layouts ops/unfold.py checks it can take).
// row_units_magic is the FastDivmod multiplier of out_w / RUN, the units of one output row.
template <typename T, typename I, int RUN>
__global__ void unfold_im2col(const T* __restrict__ x, T* __restrict__ cols, I n,
                              I x_stride_n, I x_stride_c, I x_stride_h, I x_stride_w,
                              I cols_stride_image, I cols_stride_row,
                              int channels, int height, int width, int kernel_h, int kernel_w,
                              int stride_h, int stride_w, int pad_top, int pad_left,
                              int dilation_h, int dilation_w, int out_h, int out_w,
                              unsigned int row_units_magic, unsigned int out_h_magic, unsigned int channels_magic) {
  static_assert(RUN == 1 || RUN * sizeof(T) == 16, "RUN is 1 or a 16-byte vector of T");
  if constexpr (RUN == 1) {
    unfold_windows<T, I>(x, cols, n, x_stride_n, x_stride_c, x_stride_h, x_stride_w, cols_stride_image,
                         cols_stride_row, channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_top,
                         pad_left, dilation_h, dilation_w, out_h, out_w, row_units_magic, out_h_magic,
                         channels_magic);
  } else {
    unfold_runs<T, I>(x, cols, n, x_stride_n, x_stride_c, x_stride_h, cols_stride_image, cols_stride_row, channels,
                      height, width, kernel_h, kernel_w, stride_h, pad_top, pad_left, dilation_h, dilation_w, out_h,
                      out_w, row_units_magic, out_h_magic, channels_magic);
  }
}

// Gather form of col2im (RUN = 1, `fold_col2im`'s any-shape path): one thread per output position (y, x) of FOLD_PLANES consecutive planes (image,
// channel) sums, for each plane, the taps that read it, in acc_t (float for the 16-bit types).  The planes share
// every coordinate, so the index arithmetic of a tap is paid once for FOLD_PLANES loads.  No atomics, so the result
// is bit-identical on every run.  cols is contiguous (n, C * kH * kW, L).  Tap (i, j) reads input position (y, x)
// from output pixel (oy, ox) when y + pad_top - i * dilation_h = oy * stride_h, and likewise for x: the divisions
// by the strides are fast ones.
template <typename T, typename I, bool BIAS>
__device__ __forceinline__ void fold_positions(const T* __restrict__ cols, T* __restrict__ out,
                                               const T* __restrict__ bias, I n, int channels,
                                               int height, int width, int kernel_h, int kernel_w, int stride_h,
                                               int stride_w, int pad_top, int pad_left, int dilation_h,
                                               int dilation_w, int out_h, int out_w, unsigned int width_magic,
                                               unsigned int height_magic, unsigned int stride_h_magic,
                                               unsigned int stride_w_magic, unsigned int channels_magic) {
  const I pixels = (I)out_h * out_w;
  const I plane_size = (I)height * width;
  const I planes = n * channels;
  const I total = (planes + FOLD_PLANES - 1) / FOLD_PLANES * plane_size;  // units: (plane group, y, x)
  const I cols_plane = kernel_h * kernel_w * pixels;                       // cols elements of one plane
  const FastDivmod by_width(width, width_magic), by_height(height, height_magic);
  const FastDivmod by_stride_h(stride_h, stride_h_magic), by_stride_w(stride_w, stride_w_magic);
  const FastDivmod by_channels(channels, channels_magic);  // (the bias's channel of a plane)
  for (I index = grid_start<I>(); index < total; index += grid_stride<I>()) {
    int x, y;
    const I row = index_divmod<I>(index, by_width, x);       // plane group * height + y
    const I first = index_divmod<I>(row, by_height, y) * FOLD_PLANES;
    const int count = (int)min(planes - first, (I)FOLD_PLANES);  // planes of this unit: fewer in the last group
    const int padded_x = x + pad_left;
    const T* taps = cols + first * cols_plane;
    acc_t<T> sum[FOLD_PLANES];
#pragma unroll
    for (int p = 0; p < FOLD_PLANES; ++p) sum[p] = 0;
    int ty = y + pad_top;  // = oy * stride_h for the window whose tap i reads row y
    for (int i = 0; i < kernel_h && ty >= 0; ++i, ty -= dilation_h, taps += kernel_w * pixels) {
      int ry;
      const int oy = by_stride_h.divmod(ty, ry);
      if (ry != 0 || oy >= out_h) continue;
      const T* tap = taps + (I)oy * out_w;
      int tx = padded_x;
#pragma unroll 1
      for (int j = 0; j < kernel_w && tx >= 0; ++j, tx -= dilation_w, tap += pixels) {
        int rx;
        const int ox = by_stride_w.divmod(tx, rx);
        if (rx == 0 && ox < out_w) {
#pragma unroll
          for (int p = 0; p < FOLD_PLANES; ++p) {
            if (p < count) sum[p] += to_acc(tap[p * cols_plane + ox]);
          }
        }
      }
    }
    if constexpr (BIAS) {  // conv_transpose's bias, after the taps, before the one rounding: plane p's channel
      int c;
      index_divmod<I>(first, by_channels, c);
#pragma unroll
      for (int p = 0; p < FOLD_PLANES; ++p, c = c + 1 == channels ? 0 : c + 1) sum[p] += to_acc(bias[c]);
    }
    T* dst = out + first * plane_size + (I)y * width + x;
#pragma unroll
    for (int p = 0; p < FOLD_PLANES; ++p) {
      if (p < count) dst[p * plane_size] = from_acc<T>(sum[p]);
    }
  }
}

// The taps of a kernel row whose loads a thread of `fold_runs` issues before it adds any of them: a 3-wide row at
// once, so a warp waits once a kernel row (3 times for 3 x 3), not once a tap.
constexpr int FOLD_TAPS = 3;

// col2im with 16-byte loads and stores, instantiated for the 16-bit types only (in float32 the gather's 8 planes a
// thread cost fewer instructions a position: ops/unfold.py's fold_run), where ops/unfold.py checks that it can
// run: stride 1 along x, width and out_w multiples of V = 16 / sizeof(T), cols and out 16-byte aligned.  One thread
// per run of V positions x0 .. x0 + V - 1 of one row y of one plane (image, channel): consecutive threads take
// consecutive runs, so a warp stores 512 contiguous bytes.  Tap (i, j) reads them from output pixels ox = x0 + pad_left - j * dilation_w + k (k < V) of
// output row oy, V consecutive elements of the tap's cols row: two aligned 16-byte loads and a funnel shift, as in
// `unfold_runs` (out_w is a multiple of V, so each aligned vector lies wholly inside the row or wholly outside it:
// zeros).  A kernel row that reads no window's row (a stride's remainder, oy past the end) is skipped.  Every position
// sums its taps in the order (i, j) in acc_t, as `fold_positions` does, so both give the same bits (an added +0.0
// changes no sum, and a sum from +0.0 is never -0.0).
template <typename T, typename I, bool BIAS>
__device__ __forceinline__ void fold_runs(const T* __restrict__ cols, T* __restrict__ out,
                                          const T* __restrict__ bias, I n, int channels,
                                          int height, int width, int kernel_h, int kernel_w, int stride_h,
                                          int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h,
                                          int out_w, unsigned int runs_magic, unsigned int height_magic,
                                          unsigned int stride_h_magic, unsigned int channels_magic) {
  typedef typename BitsOf<sizeof(T)>::type E;
  constexpr int V = 16 / sizeof(T);
  const int runs_per_row = width / V, taps = kernel_h * kernel_w;
  const I pixels = (I)out_h * out_w;
  const I units = n * channels * height * runs_per_row;
  const FastDivmod by_runs(runs_per_row, runs_magic), by_height(height, height_magic);
  const FastDivmod by_stride_h(stride_h, stride_h_magic), by_channels(channels, channels_magic);
  for (I index = grid_start<I>(); index < units; index += grid_stride<I>()) {
    int run, y;
    const I row = index_divmod<I>(index, by_runs, run);   // plane * height + y
    const I plane = index_divmod<I>(row, by_height, y);
    const int x0 = run * V;
    const E* plane_cols = reinterpret_cast<const E*>(cols) + plane * taps * pixels;
    acc_t<T> sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0;
    int ty = y + pad_top;  // = oy * stride_h for the windows whose tap row i reads row y
#pragma unroll 1
    for (int i = 0; i < kernel_h && ty >= 0; ++i, ty -= dilation_h) {
      int ry;
      const int oy = by_stride_h.divmod(ty, ry);
      if (ry != 0 || oy >= out_h) continue;  // no window's tap row i reads row y: nothing to add
      const E* tap_row = plane_cols + (I)i * kernel_w * pixels + (I)oy * out_w;  // tap (i, 0)'s cols row oy
      int tx = x0 + pad_left;  // = ox for tap (i, j) and position x0
#pragma unroll 1
      for (int j0 = 0; j0 < kernel_w; j0 += FOLD_TAPS) {
        uint4 lo[FOLD_TAPS], hi[FOLD_TAPS];
        int offset[FOLD_TAPS];
#pragma unroll
        for (int k = 0; k < FOLD_TAPS; ++k, tx -= dilation_w, tap_row += pixels) {  // the loads first
          const int start = tx & ~(V - 1);  // the aligned vector holding ox = tx (tx may be negative)
          offset[k] = tx - start;
          if (j0 + k < kernel_w) {
            lo[k] = load_or_zero(tap_row, start, out_w);
            hi[k] = offset[k] ? load_or_zero(tap_row, start + V, out_w) : lo[k];  // (at offset 0 window16 takes lo)
          }
        }
#pragma unroll
        for (int k = 0; k < FOLD_TAPS && j0 + k < kernel_w; ++k) {  // then the adds, in tap order
          const uint4 v = window16(lo[k], hi[k], offset[k] * (int)sizeof(T));
          const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
          for (int q = 0; q < V; ++q) sum[q] += to_acc(e[q]);
        }
      }
    }
    if constexpr (BIAS) {  // conv_transpose's bias, after the taps, before the one rounding
      int c;
      index_divmod<I>(plane, by_channels, c);
      const acc_t<T> add = to_acc(bias[c]);
#pragma unroll
      for (int q = 0; q < V; ++q) sum[q] += add;
    }
    uint4 packed;
    T* e = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int q = 0; q < V; ++q) e[q] = from_acc<T>(sum[q]);
    *reinterpret_cast<uint4*>(out + row * width + x0) = packed;
  }
}

// col2im: RUN = 1, one thread per position of FOLD_PLANES planes (`fold_positions`, any window), or
// RUN = 16 / sizeof(T), one thread per run of RUN positions with 16-byte accesses (`fold_runs`, the shapes
// ops/unfold.py checks it can take).  width_magic is the FastDivmod multiplier of width / RUN, the units of a row.
// BIAS: bias[channel] is added to every position's sum before it is rounded (conv_transpose's forward through
// the GEMM and col2im: its bias in the fold, not in a pass of its own).  A template flag, not a run-time one: the
// bias's channel arithmetic and adds cost the unbiased folds (every backward) 3% more executed instructions, which
// the model put at +37% on the H200's iv fp16 fold, whose issue and DRAM times are within 3% of each other.
template <typename T, typename I, int RUN, bool BIAS>
__global__ void fold_col2im(const T* __restrict__ cols, T* __restrict__ out, const T* __restrict__ bias,
                            I n, int channels,
                            int height, int width, int kernel_h, int kernel_w, int stride_h, int stride_w,
                            int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h,
                            int out_w, unsigned int width_magic, unsigned int height_magic,
                            unsigned int stride_h_magic, unsigned int stride_w_magic, unsigned int channels_magic) {
  static_assert(RUN == 1 || RUN * sizeof(T) == 16, "RUN is 1 or a 16-byte vector of T");
  if constexpr (RUN == 1) {
    fold_positions<T, I, BIAS>(cols, out, bias, n, channels, height, width, kernel_h, kernel_w, stride_h,
                         stride_w, pad_top, pad_left, dilation_h, dilation_w, out_h, out_w, width_magic,
                         height_magic, stride_h_magic, stride_w_magic, channels_magic);
  } else {
    fold_runs<T, I, BIAS>(cols, out, bias, n, channels, height, width, kernel_h, kernel_w, stride_h, pad_top,
                    pad_left, dilation_h, dilation_w, out_h, out_w, width_magic, height_magic, stride_h_magic,
                    channels_magic);
  }
}
