// The 16-bit and TF32 convolution forward on Hopper's warpgroup MMA (wgmma, sm_90a only: KernelFile(...,
// sm90a=True) in cupyconv/ops/wgmma_gemm.py; on every other architecture wgmma.cuh compiles to a trap and the
// planner never launches it).  Issue 24 item 10.
//
// The GEMM of conv_fwd_igemm (implicit_gemm.cu, "forward and input gradient, channels-last"): rows = output
// pixels, columns = output channels of group g, K ordered (tap, channel) over
//   x       (n, H, W, C) contiguous, 16-byte aligned (ops/implicit_gemm.py `channels_last`, the same copy);
//   weight  (D, taps, C / G) contiguous (`weight_view`, arranged once per call);
//   (float: both already rounded to tf32 by that copy, the one rounding; the tensor cores read them as tf32)
//   out     (n, D, oH, oW) contiguous (NCHW); bias (D,) added in float before the one rounding.
// C / G is a multiple of a 16-byte vector (8 elements, 4 floats: `igemm_refusal`), so a vector never straddles a
// tap or a group.
//
// Block: WGC_THREADS = 2 warpgroups on BM rows x BN columns, 256 x 64 or 128 x 128 (wgmma_gemm.py WGC_TILES).
// The tensor cores take the GEMM transposed: wgmma's M = 64 output channels (weight rows), N = 128 pixels (A rows)
// a warpgroup -- the two warpgroups split the pixels of the 64-column tile, the channels of the 128-column one --
// one m64n128k16 (m64n128k8 of tf32: wgmma_step) a warpgroup per 32-byte k step, f32 accumulators (64 a thread).
// K in chunks of 128 bytes a row (64 elements, 32 floats: 4 k steps),
// STAGES = 4 stages of A (BM rows) and B (BN rows) in the 128-byte
// swizzle wgmma reads by descriptor: row r of a stage at 128 r, its 16-byte vector v at v ^ (r % 8), each stage
// 1024-byte aligned (the pattern is taken from the address: the dynamic shared memory is rounded up by hand),
// descriptors of stride 1024 (8 rows), the k steps 32 bytes apart.  Each thread copies vector tid % 8 of
// rows tid / 8 + 32 i by 16-byte cp.async, zero-filled in the padding, past M, past D / G and past K.
// Pipeline: chunks t + 1 and t + 2 in flight while the tensor cores work on chunk t (and still on t - 1: the
// wait retires all but the newest group); one cp.async wait, proxy fence and barrier a chunk; the stage refilled
// in chunk t is that of chunk t - 2, whose wgmmas both warpgroups retired before the barrier.
// Epilogue: accumulators + bias, rounded once, to shared memory as (channel, pixel) by pairs of pixels, then
// 16-byte stores of a vector
// of consecutive output pixels of one channel where vector_store says they are whole and aligned, else scalar ones.
// 32-bit indices only (ops/wgmma_gemm.py refuses larger problems: they stay on conv_fwd_igemm).  No split of K.
// The window rows' set-up, the tap carry and the NCHW epilogue's global stores are ig_forward's (implicit_gemm.cu)
// written again for 256 threads: implicit_gemm.cu was being edited beside this task; one header for both is the
// next step.
#include "common.cuh"
#include "async_copy.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

// WGC_THREADS (two warpgroups), WGC_ROW_BYTES (a row of a stage: one 128-byte swizzle row) and WGC_ALIGN (a
// stage's 8-row swizzle pattern, the shared memory the planner adds for the rounding up) come from
// cupyconv/ops/wgmma_gemm.py (KERNELS' definitions), which sizes the launch.
#if !defined(WGC_THREADS) || !defined(WGC_ROW_BYTES) || !defined(WGC_ALIGN)
#error "wgmma_conv.cu needs the -D options of cupyconv._device.compile_options('wgmma_conv.cu')"
#endif
static_assert(WGC_THREADS == 256 && WGC_ROW_BYTES == 128 && WGC_ALIGN == 1024, "two warpgroups, 128-byte swizzle");
extern __shared__ __align__(16) unsigned char wgmma_shared[];

template <typename T, typename I, int BM, int BN, int STAGES>
__global__ void __launch_bounds__(WGC_THREADS) conv_fwd_wgmma(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    int groups, int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w,
    int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w,
    int has_bias, int vector_store) {
  static_assert(WgmmaType<T>::type >= 0 && BM * BN == 128 * 128 && STAGES >= 3, "256 x 64 or 128 x 128");
  constexpr int VEC = 16 / (int)sizeof(T), BK = WGC_ROW_BYTES / (int)sizeof(T);  // 8 and 64 elements (float 4, 32)
  constexpr int K_STEPS = WGC_ROW_BYTES / 32;                                     // wgmma_step: 32 bytes of K
  constexpr int ROWS_PER_PASS = WGC_THREADS / (WGC_ROW_BYTES / 16);               // 32
  constexpr int A_ROWS = BM / ROWS_PER_PASS, B_ROWS = BN / ROWS_PER_PASS;
  constexpr int A_BYTES = BM * WGC_ROW_BYTES, STAGE_BYTES = (BM + BN) * WGC_ROW_BYTES;
  static_assert(STAGE_BYTES % WGC_ALIGN == 0, "every stage on the swizzle pattern");

  // The stages from the first 1024-byte boundary of the dynamic shared memory (the planner adds WGC_ALIGN bytes);
  // the descriptor's address bits are the shared-window address (the emulator's too).
  const unsigned window = (unsigned)(wgmma_desc(wgmma_shared, 0, 0, 0) & 0x3FFFu) << 4;
  unsigned char* const stages = wgmma_shared + ((WGC_ALIGN - window % WGC_ALIGN) % WGC_ALIGN);

  const int tid = threadIdx.x;
  const int cg = channels_per_group, dg = outputs_per_group, channels = groups * cg;
  const int n_tiles = (dg + BN - 1) / BN, g = blockIdx.y / n_tiles, n0 = blockIdx.y % n_tiles * BN;
  const I pixels = (I)out_h * out_w, M = n * pixels, m0 = (I)blockIdx.x * BM;
  const int K = kernel_h * kernel_w * cg, chunks = (K + BK - 1) / BK;

  // --- what this thread copies: vector v of rows row0 + 32 i of A and B ------------------------------------------
  const int v = tid % (WGC_ROW_BYTES / 16), row0 = tid / (WGC_ROW_BYTES / 16);
  const int store_offset = row0 * WGC_ROW_BYTES + ((v ^ (row0 & 7)) << 4);  // + 32 i rows: the same swizzle
  I a_base[A_ROWS];
  int a_y[A_ROWS], a_x[A_ROWS];
#pragma unroll
  for (int i = 0; i < A_ROWS; ++i) {
    const I m = m0 + row0 + ROWS_PER_PASS * i;
    a_y[i] = -(1 << 30);  // rows past M: every y out of range (the reach is below 2^30)
    a_x[i] = 0;
    a_base[i] = 0;
    if (m < M) {
      const I image = m / pixels;
      const int p = (int)(m - image * pixels), oy = p / out_w, ox = p - oy * out_w;
      a_y[i] = oy * stride_h - pad_top;
      a_x[i] = ox * stride_w - pad_left;
      a_base[i] = image * height * width * channels + (I)g * cg + ((I)a_y[i] * width + a_x[i]) * channels;
    }
  }
  I b_offset[B_ROWS];
  bool b_inside[B_ROWS];
#pragma unroll
  for (int i = 0; i < B_ROWS; ++i) {
    const int col = n0 + row0 + ROWS_PER_PASS * i;
    b_inside[i] = col < dg;
    b_offset[i] = b_inside[i] ? (I)(g * dg + col) * K + v * VEC : (I)0;
  }
  // The thread's column of A: channel c of tap (r, s) at tap_offset from a window's origin, advanced by BK a
  // chunk and carried into s, then r (no division).
  int k = v * VEC, c = k, r = 0, s = 0, dy = 0, dx = 0;
  I tap_offset = c;
  auto carry = [&]() {
    while (c >= cg) {
      c -= cg;
      tap_offset += (I)dilation_w * channels - cg;
      dx += dilation_w;
      if (++s == kernel_w) {
        s = 0;
        dx = 0;
        ++r;
        dy += dilation_h;
        tap_offset += (I)dilation_h * width * channels - (I)kernel_w * dilation_w * channels;
      }
    }
  };
  carry();
  auto load_chunk = [&](int stage) {  // the thread's vectors of the next chunk, then advance to the one after
    unsigned char* a_stage = stages + stage * STAGE_BYTES;
    unsigned char* b_stage = a_stage + A_BYTES;
    const bool k_inside = k < K;
#pragma unroll
    for (int i = 0; i < A_ROWS; ++i) {
      const bool inside = k_inside && (unsigned)(a_y[i] + dy) < (unsigned)height &&
                          (unsigned)(a_x[i] + dx) < (unsigned)width;
      const T* src = inside ? x + (a_base[i] + tap_offset) : x;  // padding: zero-fill, x itself not read
      cp_async_cg_16(a_stage + store_offset + ROWS_PER_PASS * i * WGC_ROW_BYTES, src, inside ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < B_ROWS; ++i) {
      const bool inside = b_inside[i] && k_inside;
      cp_async_cg_16(b_stage + store_offset + ROWS_PER_PASS * i * WGC_ROW_BYTES,
                     inside ? weight + b_offset[i] : weight, inside ? 16 : 0);
      b_offset[i] += BK;
    }
    k += BK;
    c += BK;
    tap_offset += BK;
    carry();
  };

  // --- the pipeline ---------------------------------------------------------------------------------------------
  const int warpgroup = tid / 128;
  // The warpgroup's part of the block's tile: 64 output channels (wgmma's M: the weight rows) by WG_N pixels (N:
  // the A rows of the stages, all BM of them or half).  Channels as M rather than pixels: with 64 channels a
  // group, a warpgroup's HGMMA m64n128 reads 64 + 128 operand rows for 64 x 128 outputs where m64n64 read 64 + 64
  // for 64 x 64 (a quarter fewer shared wavefronts a MAC), and an accumulator pair is two neighbouring pixels of
  // one channel, which the NCHW epilogue stores whole.
  constexpr int WG_N = BM * BN / (2 * 64);  // 128 either tile
  const int wg_channel = BN == 128 ? 64 * warpgroup : 0, wg_pixel = BN == 64 ? WG_N * warpgroup : 0;
  float d[WG_N / 2];
#pragma unroll
  for (int i = 0; i < WG_N / 2; ++i) d[i] = 0.0f;  // (chunk 0's first wgmma ignores them: no chunks, no wgmma)
#pragma unroll
  for (int t = 0; t < STAGES - 2; ++t) {
    if (t < chunks) load_chunk(t);
    cp_async_commit();  // empty groups too: STAGES - 2 groups in flight at every wait below
  }
  // The descriptors of the warpgroup's weight rows (wgmma's A) and pixel rows (B) in stage 0, k step 0; another
  // stage or step adds its byte offset / 16 to the start address (bits 0-13: the shared window is below 256 KiB,
  // so no carry out), in the low 32 bits alone (the other fields, leading and stride bytes and swizzle, are the
  // same for A and B and in desc_high): 64-bit adds of the descriptors cost the loop some 30 instructions (NVRTC 13)
  const unsigned desc_a = (unsigned)wgmma_desc(stages + A_BYTES + wg_channel * WGC_ROW_BYTES, WGMMA_SWIZZLE_128B,
                                               16, 8 * WGC_ROW_BYTES);
  const unsigned desc_b = (unsigned)wgmma_desc(stages + wg_pixel * WGC_ROW_BYTES, WGMMA_SWIZZLE_128B, 16,
                                               8 * WGC_ROW_BYTES);
  const unsigned long long desc_high = wgmma_desc_bits(0, WGMMA_SWIZZLE_128B, 16, 8 * WGC_ROW_BYTES);
  int read_stage = 0, write_stage = STAGES - 2;
  for (int t = 0; t < chunks; ++t) {
    cp_async_wait<STAGES - 3>();  // chunk t has landed (this thread's copies) ...
    wgmma_fence_shared();         // ... visible to wgmma's reads (the async proxy) ...
    __syncthreads();              // ... everyone's; and both warpgroups retired chunk t - 2's wgmmas
    if (t + STAGES - 2 < chunks) load_chunk(write_stage);
    cp_async_commit();
    const unsigned stage16 = (unsigned)(read_stage * STAGE_BYTES) >> 4;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ++ks)
      wgmma_step<T, WG_N>(d, desc_high | (desc_a + stage16 + 2 * ks), desc_high | (desc_b + stage16 + 2 * ks),
                            t > 0 || ks > 0);
    wgmma_commit();
    wgmma_wait<1>();  // chunk t - 1's group retired: its stage may be refilled after the next barrier
    wgmma_fence_operand(d);
    read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
  }
  // The thread's two channels' biases (rows g and g + 8 of its warp's 16), added in float before the rounding:
  // lane l loads the bias of the warp's channel l % 16 (one sector a warp), the shuffles hand them out.
  const int t = tid % 128, w = t / 32, gq = t % 32 / 4, q = t % 4;
  const int channel = wg_channel + 16 * w + gq;  // and channel + 8
  const int bias_channel = n0 + wg_channel + 16 * w + t % 16;
  const float bias_lane = has_bias && bias_channel < dg ? to_acc(bias[g * dg + bias_channel]) : 0.0f;
  const float bias_lo = __shfl_sync(0xffffffffu, bias_lane, gq), bias_hi = __shfl_sync(0xffffffffu, bias_lane, gq + 8);
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  cp_async_wait<0>();  // only empty groups are left; the stages become the epilogue's tile
  __syncthreads();

  // --- epilogue: tile[channel][pixel] = T(acc + bias), then stores along the output pixels ------------------------
  // Accumulators 4 j .. 4 j + 3 of a thread (wgmma.cuh): channel 16 w + g, pixels 8 j + 2 q and + 1, then channel
  // + 8, the same pixels: each pair one store of two elements.  PITCH: a channel's BM elements and 8 more, so
  // that a warp's 8 channels start 4 (16-bit pairs) or 8 (float pairs) banks apart: no bank conflicts.
  constexpr int PITCH = (BM + 8) * (int)sizeof(T);
  static_assert(BN * PITCH <= STAGES * STAGE_BYTES, "the tile within the stages' bytes");
  unsigned char* const lo_row = wgmma_shared + channel * PITCH + (wg_pixel + 2 * q) * (int)sizeof(T);
#pragma unroll
  for (int j = 0; j < WG_N / 8; ++j) {
    store_pair<T>(lo_row + 8 * j * (int)sizeof(T), d[4 * j] + bias_lo, d[4 * j + 1] + bias_lo);
    store_pair<T>(lo_row + 8 * PITCH + 8 * j * (int)sizeof(T), d[4 * j + 2] + bias_hi, d[4 * j + 3] + bias_hi);
  }
  __syncthreads();
  // Thread: the vector of pixels m0 + mv * VEC .. + VEC - 1 of channels tid / (BM / VEC) + COLUMN_STEP i.
  constexpr int ROW_VECTORS = BM / VEC, COLUMN_STEP = WGC_THREADS / ROW_VECTORS;
  const int mv = tid % ROW_VECTORS;
  I out_row[VEC];  // where each of the thread's pixels lies in out (channel 0 of the group), or -1 past M
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const I m = m0 + mv * VEC + e, image = m / pixels;
    out_row[e] = m < M ? (image * groups * dg + (I)g * dg) * pixels + (m - image * pixels) : (I)-1;
  }
  for (int col = tid / ROW_VECTORS; col < BN; col += COLUMN_STEP) {
    const int nn = n0 + col;
    if (nn >= dg) break;
    const unsigned char* src = wgmma_shared + col * PITCH + mv * 16;
    if (vector_store) {  // pixels % VEC == 0 and out 16-byte aligned: a vector never straddles two images
      if (out_row[0] >= 0)
        *reinterpret_cast<uint4*>(out + out_row[0] + (I)nn * pixels) = *reinterpret_cast<const uint4*>(src);
    } else {
      const T* values = reinterpret_cast<const T*>(src);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (out_row[e] >= 0) out[out_row[e] + (I)nn * pixels] = values[e];
      }
    }
  }
}
