// The data movement of the 3-D fold (cupyconv/ops/lift.py): a 3-D convolution runs as a 2-D one over its "depth
// windows", planes (c, a) of the input depths each output depth reads, and its input gradient is the windows'
// gradient summed back onto those depths.  With image (m, z) of the chunk's output depths z0 <= z0 + z < z0 + od
// and tap a < kd, window plane ((m, z), (c, a)) is input plane (m, c) at depth z * sd + a * dd + depth0, depth0 =
// z0 * sd - pad_front, or zeros where that depth is outside [0, depth).
//
// Both kernels loop over planes (blockIdx.y, grid-stride) and, within a plane, over its pixels (blockIdx.x and the
// threads, grid-stride): a plane's coordinates are split once per block and plane, and consecutive threads take
// consecutive pixels, so loads and stores of a warp are coalesced wherever the pixels are contiguous.  One launch
// does what took two or three array copies per tap before (the zeros of padded depths, the copies of the others,
// the adds of the gradient).
#include "common.cuh"

// Pixels a thread takes per pass over a plane, LIFT_THREADS (the block) apart, so that each of them is coalesced and
// the offsets between them are constants: the plane's set-up and each tap's test are paid once per LIFT_RUN
// pixels.  cupyconv/ops/lift.py plans the grid with both.
#if !defined(LIFT_RUN) || !defined(LIFT_THREADS)
#error "lift.cu needs the -D options of cupyconv._device.compile_options('lift.cu')"
#endif

// windows (m * od, C * kd, H, W) contiguous from x (m, C, D, H, W) through its element strides (flat_rows: a
// plane's pixels p lie p * x_stride_w apart, no split of p into row and column).
template <typename T, typename I>
__global__ void __launch_bounds__(LIFT_THREADS) depth_windows(const T* __restrict__ x, T* __restrict__ windows, I planes, int pixels, int width,
                              unsigned int width_magic, int channels, unsigned int channels_magic, int taps,
                              unsigned int taps_magic, int out_depths, unsigned int out_depths_magic, int depth,
                              int depth_step, int tap_depth, int depth0, I x_stride_m, I x_stride_c,
                              I x_stride_d, I x_stride_h, I x_stride_w, int flat_rows) {
  const FastDivmod by_width(width, width_magic), by_channels(channels, channels_magic), by_taps(taps, taps_magic),
      by_out_depths(out_depths, out_depths_magic);
  const T zero = from_acc<T>(acc_t<T>(0));
  for (I plane = blockIdx.y; plane < planes; plane += gridDim.y) {
    int a, c, z;
    const I m = index_divmod<I>(index_divmod<I>(index_divmod<I>(plane, by_taps, a), by_channels, c), by_out_depths, z);
    const int d = z * depth_step + a * tap_depth + depth0;
    const bool inside = d >= 0 && d < depth;
    const T* src = x + m * x_stride_m + (I)c * x_stride_c + (I)(inside ? d : 0) * x_stride_d;
    T* dst = windows + plane * pixels;
    for (int base = blockIdx.x * LIFT_THREADS * LIFT_RUN + threadIdx.x; base < pixels;
         base += gridDim.x * LIFT_THREADS * LIFT_RUN) {
      if (!inside) {   // a padded depth: zeros
#pragma unroll
        for (int k = 0; k < LIFT_RUN; ++k) {
          if (base + k * LIFT_THREADS < pixels) dst[base + k * LIFT_THREADS] = zero;
        }
      } else if (flat_rows) {   // pixel p at p * x_stride_w: one pointer, stepped
        const T* from = src + (I)base * x_stride_w;
        const I step = (I)LIFT_THREADS * x_stride_w;
#pragma unroll
        for (int k = 0; k < LIFT_RUN; ++k, from += step) {
          if (base + k * LIFT_THREADS < pixels) dst[base + k * LIFT_THREADS] = *from;
        }
      } else {
#pragma unroll
        for (int k = 0; k < LIFT_RUN; ++k) {
          const int p = base + k * LIFT_THREADS;
          if (p < pixels) {
            int xx;
            const int y = by_width.divmod(p, xx);
            dst[p] = src[(I)y * x_stride_h + (I)xx * x_stride_w];
          }
        }
      }
    }
  }
}

// out (m, C, D, H, W) contiguous, in acc_t<T>, += the gradient g (m * od, C * kd, H, W) contiguous of the windows
// of out's images over the chunk's od output depths: each element of out adds the window elements read from it,
// taps in order (a = 0, 1, ...), so the sums are the same bits on every run (a gather: no atomics) and the same as
// adding the taps' planes one tap at a time.  Which taps read a depth is the plane's, tested once per pass.
template <typename T, typename I>
__global__ void __launch_bounds__(LIFT_THREADS) depth_fold(const T* __restrict__ g, acc_t<T>* __restrict__ out, I planes, int pixels,
                           int channels, unsigned int channels_magic, int taps, int out_depths, int depth,
                           unsigned int depth_magic, int depth_step, unsigned int depth_step_magic, int tap_depth,
                           int depth0) {
  const FastDivmod by_channels(channels, channels_magic), by_depth(depth, depth_magic),
      by_step(depth_step, depth_step_magic);
  for (I plane = blockIdx.y; plane < planes; plane += gridDim.y) {
    int d, c;
    const I m = index_divmod<I>(index_divmod<I>(plane, by_depth, d), by_channels, c);
    acc_t<T>* dst = out + plane * pixels;
    const T* image = g + (m * out_depths * channels + c) * taps * (I)pixels;   // tap 0 of output depth 0
    for (int base = blockIdx.x * LIFT_THREADS * LIFT_RUN + threadIdx.x; base < pixels;
         base += gridDim.x * LIFT_THREADS * LIFT_RUN) {
      acc_t<T> sum[LIFT_RUN];
#pragma unroll
      for (int k = 0; k < LIFT_RUN; ++k) {
        const int p = base + k * LIFT_THREADS;
        sum[k] = p < pixels ? dst[p] : acc_t<T>(0);
      }
      for (int a = 0; a < taps; ++a) {   // tap a of output depth z reads depth d when z * sd = d - a * dd - depth0
        const int reach = d - a * tap_depth - depth0;
        if (reach < 0) break;             // (and for every later tap)
        int rest;
        const int z = by_step.divmod(reach, rest);
        if (rest != 0 || z >= out_depths) continue;
        const T* tap = image + ((I)z * channels * taps + a) * pixels;
#pragma unroll
        for (int k = 0; k < LIFT_RUN; ++k) {
          const int p = base + k * LIFT_THREADS;
          if (p < pixels) sum[k] += to_acc(tap[p]);
        }
      }
#pragma unroll
      for (int k = 0; k < LIFT_RUN; ++k) {
        const int p = base + k * LIFT_THREADS;
        if (p < pixels) dst[p] = sum[k];
      }
    }
  }
}
