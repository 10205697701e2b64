// unfold (im2col) and fold (col2im) over a flat batch of planes x (n, C, H, W).
//
// cols holds rows ordered (c, i, j) of L = oH * oW pixels each.  fold reads torch's layout
// (n, C * kH * kW, L); unfold writes any layout whose pixels are contiguous, given the distance between
// images and between rows: torch's, or (C * kH * kW, n, L), where each group's rows form one matrix over
// n * L for the weight-gradient GEMM.
#include "common.cuh"

// One thread per (image, channel, output pixel) window: it copies the window's kH * kW taps, so the index
// arithmetic is paid once per window, not once per tap.  Consecutive threads take consecutive output pixels,
// so every store of a tap is coalesced.  x is read through element strides (any layout, negative included).
template <typename T, typename I>
__global__ void unfold_im2col(const T* __restrict__ x, T* __restrict__ cols, I n,
                              I x_stride_n, I x_stride_c, I x_stride_h, I x_stride_w,
                              I cols_stride_image, I cols_stride_row,
                              int channels, int height, int width, int kernel_h, int kernel_w,
                              int stride_h, int stride_w, int pad_top, int pad_left,
                              int dilation_h, int dilation_w, int out_h, int out_w) {
  const I pixels = (I)out_h * out_w;
  const I windows = n * channels * pixels;
  for (I index = grid_start<I>(); index < windows; index += grid_stride<I>()) {
    const int ox = (int)(index % out_w);
    const int oy = (int)((index / out_w) % out_h);
    const I plane = index / pixels;  // image * channels + channel
    const int c = (int)(plane % channels);
    const I image = plane / channels;
    const T* src = x + image * x_stride_n + c * x_stride_c;
    T* dst = cols + image * cols_stride_image + (I)c * kernel_h * kernel_w * cols_stride_row + (I)oy * out_w + ox;
    const int y0 = oy * stride_h - pad_top;
    const int x0 = ox * stride_w - pad_left;
    for (int i = 0; i < kernel_h; ++i) {
      const int y = y0 + i * dilation_h;
      const bool row_inside = y >= 0 && y < height;
      for (int j = 0; j < kernel_w; ++j) {
        const int xx = x0 + j * dilation_w;
        T value = from_acc<T>(acc_t<T>(0));
        if (row_inside && xx >= 0 && xx < width) value = src[y * x_stride_h + xx * x_stride_w];
        dst[(I)(i * kernel_w + j) * cols_stride_row] = value;
      }
    }
  }
}

// Gather form of col2im: one thread per output element (image, channel, y, x) sums the taps that read it.
// No atomics, so the result is bit-identical on every run.  cols is contiguous (n, C * kH * kW, L).
template <typename T, typename I>
__global__ void fold_col2im(const T* __restrict__ cols, T* __restrict__ out, I n, int channels,
                            int height, int width, int kernel_h, int kernel_w, int stride_h, int stride_w,
                            int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h,
                            int out_w) {
  const I pixels = (I)out_h * out_w;
  const I total = n * channels * height * width;
  for (I index = grid_start<I>(); index < total; index += grid_stride<I>()) {
    const int xx = (int)(index % width) + pad_left;
    const int y = (int)((index / width) % height) + pad_top;
    const I plane = index / ((I)height * width);  // image * channels + channel
    const T* src = cols + plane * kernel_h * kernel_w * pixels;
    acc_t<T> sum = 0;
    for (int i = 0; i < kernel_h; ++i) {
      const int ty = y - i * dilation_h;  // = oy * stride_h for the window whose tap i reads row y
      if (ty < 0) break;
      if (ty % stride_h) continue;
      const int oy = ty / stride_h;
      if (oy >= out_h) continue;
      for (int j = 0; j < kernel_w; ++j) {
        const int tx = xx - j * dilation_w;
        if (tx < 0) break;
        if (tx % stride_w) continue;
        const int ox = tx / stride_w;
        if (ox >= out_w) continue;
        sum += to_acc(src[(I)(i * kernel_w + j) * pixels + (I)oy * out_w + ox]);
      }
    }
    out[index] = from_acc<T>(sum);
  }
}
