// Index pieces shared by the implicit GEMMs' operand gathers (implicit_gemm.cu on the tensor cores, simt_gemm.cu on
// the FMA units): unsigned offsets, the decode of a (channel, tap) GEMM index, and the images of a batch view.
#pragma once
#include "common.cuh"

// The gathers add an offset per row to an offset per column.  Either part alone may lie outside the tensor (a
// window origin in the padding, a tap past the image's edge), so the parts are kept unsigned, where sums wrap
// instead of overflowing; a sum is used as an index only for an element inside the tensor, where it is exact.
template <typename I> struct Unsigned;
template <> struct Unsigned<int> { typedef unsigned type; };
template <> struct Unsigned<long long> { typedef unsigned long long type; };

// A GEMM index (c, i, j) = c * taps + i * kW + j over x: the offset of tap (i, j) of channel c from a window's
// origin in x, and the tap's position in the window (a forward's columns, a weight gradient's rows).
template <typename I> struct WindowTap {
  typename Unsigned<I>::type offset;
  int dy, dx;
};
template <typename I>
__device__ __forceinline__ WindowTap<I> decode_tap(int index, const FastDivmod& taps, const FastDivmod& kernel_w,
                                                   int dilation_h, int dilation_w, I stride_c, I stride_h,
                                                   I stride_w) {
  typedef typename Unsigned<I>::type U;
  int tap, j;
  const int c = taps.divmod(index, tap), i = kernel_w.divmod(tap, j), dy = i * dilation_h, dx = j * dilation_w;
  return {(U)c * (U)stride_c + (U)dy * (U)stride_h + (U)dx * (U)stride_w, dy, dx};
}

// Where image q of a batch view (outer, inner, ...) starts (it divides: prologues only).
template <typename I> struct BatchView {
  I inner, stride_outer, stride_inner;
  __device__ I image(I q) const { return (q / inner) * stride_outer + (q % inner) * stride_inner; }
};

// Output pixel m = (image, p) of a forward's GEMM rows: the input position (y, x) of its window's top-left tap,
// which may lie in the padding, and that tap's offset in x from group g's first channel.  Rows past M get a y no
// tap can reach (the reach is below 2^30), so they read nothing.
template <typename I> struct WindowRow {
  typename Unsigned<I>::type origin;
  int y, x;
};
template <typename I>
__device__ __forceinline__ WindowRow<I> window_row(I m, I M, I pixels, const BatchView<I>& view, I group_start,
                                                   int out_w, int stride_h, int stride_w, int pad_top, int pad_left,
                                                   I x_stride_h, I x_stride_w) {
  typedef typename Unsigned<I>::type U;
  if (m >= M) return {0, -(1 << 30), 0};
  const I image = m / pixels;
  const int p = (int)(m - image * pixels), y = p / out_w * stride_h - pad_top, x = p % out_w * stride_w - pad_left;
  return {(U)(view.image(image) + group_start) + (U)y * (U)x_stride_h + (U)x * (U)x_stride_w, y, x};
}
