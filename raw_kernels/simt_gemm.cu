// Strict float32 implicit GEMMs of conv2d on the FMA units (no tensor cores, no TF32, no column matrix): the
// forward, which also serves the stride-1 input gradient (the forward of the transposed problem, flipped and
// transposed weight, as the direct kernel's), and the weight gradient.  Each is one GEMM per group,
// C (M x N) = A (M x K) * B (K x N), whose operands are gathered straight from the tensors; tap = i * kW + j:
//
//   kernel           M (rows)                  N        K (reduction)             A[m][k]           B[k][n]
//   simt_fwd         images * oH * oW pixels   D / G    (c, tap): C / G * taps    x at (m, c, tap)  weight_t[k][n]
//   simt_bwd_weight  (c, tap): C / G * taps    D / G    images * oH * oW pixels   x at (k, c, tap)  grad_out[n][k]
//
// x is read through a batch view (image q at (q / x_inner) * x_stride_outer + (q % x_inner) * x_stride_inner,
// then c, h, w strides); out and grad_out are contiguous (images, D, oH, oW); weight_t is the weight transposed
// per group, contiguous (G, C / G * taps, D / G) but zero-padded to (G, K rounded up to SIMT_WEIGHT_K_ALIGN, D / G
// rounded up to the column tile) and 16-byte aligned, so that a warp reads B along n in whole 128-byte lines.
//
// A block of BM * BN / (TM * 8) threads computes a BM x BN tile of C, each thread TM x 8 of it in registers:
// rows 4 tm.. + q BM / (TM / 4) for q < TM / 4, columns 4 tn.. and BN / 2 + 4 tn.., read as float4 from shared
// memory (no bank conflict: a quarter warp reads one float4 of A and 8 consecutive of B).  Every float a thread
// reads from shared memory feeds TM (or 8) FMAs, so TM = 16 needs 24 loads per 128 FMAs, not 16 per 64.  K goes in
// chunks of SIMT_BK (simt_fwd_chunk: 16 for three forward tiles), staged k-major ([k][row], rows padded by 4 floats
// so that stores along k hit distinct banks).  On sm_70 both kernels stage through registers in two stages: the
// global loads of chunk t + 1 go to registers before the FMAs of chunk t and to the other stage after them, one
// barrier per chunk; the weight gradient's B always does (its column sums are taken there).  On sm_80+ the forward
// copies each element of A global -> shared by a 4-byte cp.async (zero-filled outside the problem: no register,
// store or zeroing), and B, its weight_t zero-padded to whole chunks and column tiles, by unpredicated 16-byte ones,
// into SIMT_ASYNC_STAGES stages (two with chunks of 16), one wait and one barrier per chunk, and the weight gradient
// its A into the other of its two stages.  Each operand is loaded with the lanes of a warp
// along its rows (the forward: pixels of x, columns n of weight_t) or along k (the weight gradient's pixels),
// whichever runs along memory. The main loop decodes nothing by division: a k slot's tap comes from FastDivmod, a
// pixel cursor advances by SIMT_BK with carries; the divisions of the prologue and epilogue are paid once per row.
// The weight gradient writes float sums per split of its reduction (grid.z), which the launcher adds up in a fixed
// order, so its bits depend on the shapes only; its bias gradient is the column sums of B (grad_out) that the
// blocks of the first row tile add up as they load it (Gather::SUMS_B), not a GEMM row of ones (which cost a whole
// row tile where C / G * taps fills its tiles exactly: 288 rows in 96-row tiles).  The planner is
// cupyconv/ops/simt_gemm.py `plan_simt`.
#include "async_copy.cuh"
#include "common.cuh"
#include "gather.cuh"

#if !defined(SIMT_MAX_THREADS)
#error "simt_gemm.cu needs the -D options of cupyconv._device.compile_options('simt_gemm.cu')"
#endif
constexpr int SIMT_BK = 8;   // the K chunk
constexpr int SIMT_PAD = 4;  // floats after each staged row of a chunk: keeps float4 alignment, spreads banks
constexpr int SIMT_ASYNC_STAGES = 3;
constexpr int SIMT_WEIGHT_K_ALIGN = 16;  // simt_fwd's weight_t rows: K padded to a multiple of every chunk  // the cp.async pipeline's: two chunks in flight while the FMAs read a third
// The forward's chunk and stages with cp.async: K chunks of 16 for the 256 x 64, 192 x 64 and 128 x 32 tiles (the
// loop's per-chunk upkeep -- barrier, wait, stage addresses, loop -- paid per 2,048 FFMA of a thread at 256 x 64,
// not 1,024; 192 x 64 x 12: 1.213 loop instructions a FFMA, not 1.237, 209 registers), in two stages (the same
// bytes as three of 8, within 48 KiB of static shared memory).  The other tiles gained nothing or spilled
// (256 x 32) or lost an occupancy step (128 x 64: 128 -> 167 registers).  Mirrored by cupyconv/ops/simt_gemm.py
// simt_fwd_chunk.
__host__ __device__ constexpr int simt_fwd_chunk(bool async, int bm, int bn) {
  return async && ((bm == 256 && bn == 64) || (bm == 192 && bn == 64) || (bm == 128 && bn == 32)) ? 16 : SIMT_BK;
}

// Which elements of an R x SIMT_BK operand chunk a thread loads, the same for every chunk: ROW_SLOTS rows by
// K_SLOTS k.  LANES_ON_ROWS: a warp reads one k of 32 consecutive rows; otherwise a warp reads 8 consecutive k
// of 4 rows.
template <int R, int THREADS, bool LANES_ON_ROWS, int BK = SIMT_BK> struct SimtLoad {
  static constexpr int WARPS = THREADS / 32, ROW_SLOTS = R / 32, K_SLOTS = BK / WARPS;
  static_assert(R % 32 == 0 && BK % WARPS == 0, "rows in warps of 32, k in whole warps");
  __device__ static int row(int rs) { return (threadIdx.x & 31) + 32 * rs; }
  __device__ static int k(int ks) { return (threadIdx.x >> 5) + WARPS * ks; }
};
template <int R, int THREADS, int BK> struct SimtLoad<R, THREADS, false, BK> {
  static constexpr int PER_PASS = THREADS / BK, ROW_SLOTS = R / PER_PASS, K_SLOTS = 1;
  static_assert(R % PER_PASS == 0, "whole passes of rows");
  __device__ static int row(int rs) { return threadIdx.x / BK + PER_PASS * rs; }
  __device__ static int k(int) { return threadIdx.x % BK; }
};

// An output pixel k = (image, p) of the reduction of the weight gradient, advanced by SIMT_BK with carries.
template <typename I> struct SimtPixel {
  I image;
  int p;
  __device__ void advance(int pixels) {
    p += SIMT_BK;
    while (p >= pixels) {  // at most once for planes of SIMT_BK pixels or more
      p -= pixels;
      ++image;
    }
  }
};

// The GEMM of one block tile: rows m0.., columns n0.., k from k_begin to k_end (k_begin a multiple of BK, the
// Gather's chunk: SIMT_BK, or 16 for three of the forward's tiles with cp.async).
// `Gather` supplies the operands and takes the results:
//   typedefs LoadA, LoadB (SimtLoad layouts), ACursor, BCursor; M, N;
//   BK, STAGES, ASYNC (static): the K chunk, the stages of shared memory, whether operands go by cp.async
//     (a_copy: a(at, rs) into shared memory; B's whole chunk by b_copy_chunk(stage, rows) from
//     b_chunk_start(k), moved on by b_chunk_advance) or through registers (a/b, then a store);
//   ACursor a_start(I k), a_advance(ACursor&) (k += BK); the same for B: what GEMM index k means for the
//     operand, decoded once per chunk and k slot for all of the thread's rows;
//   float a(const ACursor&, int rs), b(const BCursor&, int rs): the element at the cursor and the thread's row
//     slot rs, 0 outside the problem (rows past M or N, k past K);
//   I out_row(I m), store(I row, int n, float value): where row m of C goes, and element (m, n) itself;
//     rows_in_fours: rows 4 r.. 4 r + 3 of a column lie at out_row(4 r) + 0..3, 16-byte aligned, which
//     store4(I row, int n, float4) writes at once; has_bias, float column_bias(int n): added to column n;
//   SUMS_B (static): also sum B over the block's k per column, each thread its own loaded elements as it loads
//     them, then the SIMT_BK slots of a column in order (fixed order: the same bits on every run); where
//     `sums_b`, store_b_sum(int n, float sum) takes column n's.
template <typename I, int BM, int BN, int TM, class Gather>
__device__ __forceinline__ void simt_block(const Gather& gather, float* as, float* bs, I m0, int n0, I k_begin,
                                           I k_end) {
  typedef typename Gather::LoadA LA;
  typedef typename Gather::LoadB LB;
  constexpr int PA = BM + SIMT_PAD, PB = BN + SIMT_PAD;
  constexpr int ROW_SPAN = 4 * BM / TM;  // between a thread's groups of 4 rows
  static_assert(TM % 4 == 0 && BM % TM == 0 && BN % 8 == 0, "whole thread tiles");
  constexpr int BK = Gather::BK;
  const int tn = threadIdx.x % (BN / 8), tm = threadIdx.x / (BN / 8);

  const I chunks = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;  // uniform across the block
  typename Gather::ACursor a_at[LA::K_SLOTS];
  typename Gather::BCursor b_at[LB::K_SLOTS];
#pragma unroll
  for (int ks = 0; ks < LA::K_SLOTS; ++ks) a_at[ks] = gather.a_start(k_begin + LA::k(ks));
#pragma unroll
  for (int ks = 0; ks < LB::K_SLOTS; ++ks) b_at[ks] = gather.b_start(k_begin + LB::k(ks));

  float a_next[LA::K_SLOTS][LA::ROW_SLOTS], b_next[LB::K_SLOTS][LB::ROW_SLOTS];
  float b_sum[LB::K_SLOTS][LB::ROW_SLOTS] = {};  // SUMS_B: this thread's loaded elements of B, summed per slot
  auto load_chunk = [&]() {  // the chunk at the cursors, then the cursors move on by one chunk
    if constexpr (!Gather::ASYNC_A) {  // (else A goes by copy_a)
#pragma unroll
      for (int ks = 0; ks < LA::K_SLOTS; ++ks) {
#pragma unroll
        for (int rs = 0; rs < LA::ROW_SLOTS; ++rs) a_next[ks][rs] = gather.a(a_at[ks], rs);
        gather.a_advance(a_at[ks]);
      }
    }
#pragma unroll
    for (int ks = 0; ks < LB::K_SLOTS; ++ks) {
#pragma unroll
      for (int rs = 0; rs < LB::ROW_SLOTS; ++rs) {
        b_next[ks][rs] = gather.b(b_at[ks], rs);
        if constexpr (Gather::SUMS_B) b_sum[ks][rs] += b_next[ks][rs];
      }
      gather.b_advance(b_at[ks]);
    }
  };
  auto store_chunk = [&](int stage) {
    if constexpr (!Gather::ASYNC_A) {
#pragma unroll
      for (int ks = 0; ks < LA::K_SLOTS; ++ks) {
#pragma unroll
        for (int rs = 0; rs < LA::ROW_SLOTS; ++rs) as[(stage * BK + LA::k(ks)) * PA + LA::row(rs)] = a_next[ks][rs];
      }
    }
#pragma unroll
    for (int ks = 0; ks < LB::K_SLOTS; ++ks) {
#pragma unroll
      for (int rs = 0; rs < LB::ROW_SLOTS; ++rs) bs[(stage * BK + LB::k(ks)) * PB + LB::row(rs)] = b_next[ks][rs];
    }
  };

  float acc[TM][8];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  }

  auto fma_chunk = [&](int stage) {  // the FMAs of the chunk staged in `stage`
    const float* a_stage = as + stage * BK * PA + 4 * tm;
    const float* b_stage = bs + stage * BK * PB + 4 * tn;
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM];
#pragma unroll
      for (int q = 0; q < TM / 4; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(a_stage + k * PA + q * ROW_SPAN);
        a[4 * q] = v.x, a[4 * q + 1] = v.y, a[4 * q + 2] = v.z, a[4 * q + 3] = v.w;
      }
      const float4 b0 = *reinterpret_cast<const float4*>(b_stage + k * PB);
      const float4 b1 = *reinterpret_cast<const float4*>(b_stage + k * PB + BN / 2);
      const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
  };

  auto copy_a = [&](int stage) {  // ASYNC or ASYNC_A: A's chunk at the cursors into `stage` by cp.async, then on
#pragma unroll
    for (int ks = 0; ks < LA::K_SLOTS; ++ks) {
#pragma unroll
      for (int rs = 0; rs < LA::ROW_SLOTS; ++rs)
        gather.a_copy(as + (stage * BK + LA::k(ks)) * PA + LA::row(rs), a_at[ks], rs);
      gather.a_advance(a_at[ks]);
    }
  };

  if constexpr (Gather::ASYNC) {
    // cp.async (sm_80+): each element goes global -> shared by one 4-byte copy, zero-filled outside the problem
    // (no staging register, no store, no zeroing), SIMT_ASYNC_STAGES - 1 chunks in flight.  Chunk t + S - 1 goes
    // to the stage chunk t - 1 was read from: every thread finished that before the barrier of iteration t.
    constexpr int S = Gather::STAGES;
    auto b_chunk = gather.b_chunk_start(k_begin);  // B by whole 16-byte copies (b_copy_chunk)
    auto issue_chunk = [&](int stage) {  // the chunk at the cursors into `stage`, then the cursors move on
      copy_a(stage);
      gather.b_copy_chunk(bs + stage * BK * PB, b_chunk);
      gather.b_chunk_advance(b_chunk);
    };
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (s < chunks) issue_chunk(s);
      cp_async_commit();  // an empty group past the last chunk: the wait below counts S - 2 groups behind
    }
    int read = 0, write = S - 1;
    for (I t = 0; t < chunks; ++t) {
      cp_async_wait<S - 2>();  // chunk t's group has landed (this thread's copies),
      __syncthreads();         // and every thread's; the stage `write` is no longer read
      if (t + S - 1 < chunks) issue_chunk(write);
      cp_async_commit();
      fma_chunk(read);
      read = read == S - 1 ? 0 : read + 1;
      write = write == S - 1 ? 0 : write + 1;
    }
    cp_async_wait<0>();  // nothing in flight past the loop (the epilogue's SUMS_B reuses bs)
  } else {
    // B through registers (the weight gradient sums it as it loads it), A too unless ASYNC_A: then by cp.async
    // into the other stage before the FMAs (it was last read before the previous barrier), landed before the
    // barrier that ends the chunk.
    auto copy_a_group = [&](int stage) {
      copy_a(stage);
      cp_async_commit();
    };
    if (chunks > 0) {
      if constexpr (Gather::ASYNC_A) copy_a_group(0);
      load_chunk();
      store_chunk(0);
    }
    if constexpr (Gather::ASYNC_A) cp_async_wait<0>();
    __syncthreads();
    for (I t = 0; t < chunks; ++t) {
      const int stage = (int)(t & 1);
      if (t + 1 < chunks) {  // in flight while the FMAs work on chunk t
        if constexpr (Gather::ASYNC_A) copy_a_group(stage ^ 1);
        load_chunk();
      }
      fma_chunk(stage);
      if (t + 1 < chunks) store_chunk(stage ^ 1);  // the other stage: last read before the previous barrier
      if constexpr (Gather::ASYNC_A) cp_async_wait<0>();
      __syncthreads();
    }
  }

  // The column sums of B: the slots of each column from shared memory (free after the loop's last barrier), in k
  // order.  `sums_b` is uniform across the block, so the barrier is too.
  if constexpr (Gather::SUMS_B) {
    if (gather.sums_b) {
#pragma unroll
      for (int ks = 0; ks < LB::K_SLOTS; ++ks) {
#pragma unroll
        for (int rs = 0; rs < LB::ROW_SLOTS; ++rs) bs[LB::k(ks) * BN + LB::row(rs)] = b_sum[ks][rs];
      }
      __syncthreads();
      for (int col = threadIdx.x; col < BN; col += blockDim.x) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < BK; ++k) sum += bs[k * BN + col];
        if (n0 + col < gather.N) gather.store_b_sum(n0 + col, sum);
      }
    }
  }

  // Epilogue.  Each of the thread's columns gets its bias read once (-0.0f without one: x + -0.0f is x, bit for
  // bit), each group of its 4 consecutive rows is placed once, and where those rows lie in memory as 4 consecutive,
  // 16-byte aligned elements (`rows_in_fours`) a column of them is one float4 store: a warp (8 column slots x 4 row
  // groups) then writes 64 contiguous bytes per column, whole sectors, instead of 4 scalars spread over 2 sectors.
  float add[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int n = n0 + 4 * tn + (j & 3) + (j >> 2) * (BN / 2);
    add[j] = gather.has_bias && n < gather.N ? gather.column_bias(n) : -0.0f;
  }
#pragma unroll
  for (int q = 0; q < TM / 4; ++q) {
    const I m = m0 + 4 * tm + q * ROW_SPAN;
    if (m >= gather.M) continue;
    if (gather.rows_in_fours && m + 3 < gather.M) {
      const I row = gather.out_row(m);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int n = n0 + 4 * tn + (j & 3) + (j >> 2) * (BN / 2);
        const float4 v = {acc[4 * q][j] + add[j], acc[4 * q + 1][j] + add[j], acc[4 * q + 2][j] + add[j],
                          acc[4 * q + 3][j] + add[j]};
        if (n < gather.N) gather.store4(row, n, v);
      }
    } else {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (m + r >= gather.M) break;
        const I row = gather.out_row(m + r);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int n = n0 + 4 * tn + (j & 3) + (j >> 2) * (BN / 2);
          if (n < gather.N) gather.store(row, n, acc[4 * q + r][j] + add[j]);
        }
      }
    }
  }
}

// Forward: A = x gathered per output pixel (lanes on pixels), B = weight_t rows (lanes on n).  The gather is set up
// once so that the main loop neither divides nor recomputes bounds (the idea of CUTLASS's "optimized" activation
// iterator, in our own form):
// - each of the thread's pixels keeps its window's origin in x (signed: it may lie in the padding, and x's strides
//   may be negative) and the mask of the window's rows and columns that lie inside x: bit j for column j (j < kW),
//   bit kW + i for row i;
// - a k slot = (c, tap) keeps its channel's offset and its entry of the block's tap table (shared memory): the
//   tap's offset from a window origin and its bits 1 << j | 1 << (kW + i), and where the slot goes a chunk, BK,
//   later: the entry of tap (tap + BK) % taps and the channels to add, (tap + BK) / taps, as an offset in x; so
//   moving on is one load of the entry and one add, no carry (`SimtForward::NEXT_ENTRY`; the two-warp tiles read
//   the entry's head and add BK % taps entries and BK / taps channels with a carry);
// - an element is inside x when its tap's bits are all in its pixel's mask: one AND per element, no compare.
// k past K gets SIMT_PAST_K, a bit no mask has, so kW + kH <= SIMT_MASK_BITS (simt_refusal on the host).
constexpr int SIMT_MASK_BITS = 31;
constexpr unsigned SIMT_PAST_K = 1u << SIMT_MASK_BITS;
constexpr int SIMT_MAX_TAPS = 15 * 16;  // the most taps with kH + kW <= 31
// An entry's head (SimtTapHead, what the two-warp tiles read: one LDS.64 with int indices), then where its k slot
// goes next.  One LDS.128 a whole entry with int indices; 24 bytes in three LDS.64 with long long (aligned to 32
// bytes, the table would not fit beside 256 x 64 x 16's stages in 48 KiB).
template <typename I> struct __align__(8) SimtTapHead {
  typename Unsigned<I>::type offset;  // the tap's offset from a window origin
  unsigned bits;                      // 1 << j | 1 << (kW + i)
};
template <typename I> struct __align__(sizeof(I) == 4 ? 16 : 8) SimtTap {
  typename Unsigned<I>::type offset;
  unsigned bits;
  int next;                           // the entry of tap (tap + BK) % taps, as a byte offset in the table
  typename Unsigned<I>::type step;    // ((tap + BK) / taps) x_stride_c: to the channel of k + BK
};

// The positions t < k of a window at start + t (dilation 1) that lie inside [0, extent), as bits 1 << t: the run
// from -start to extent - start, the end clipped to k (a start past k ends the run empty).  Unsigned differences:
// start may lie 2^30 before the plane (rows past M) while extent nears 2^31.  Per row slot about 10 instructions an
// axis, where the loops over the window's taps ran kH + kW trips (p-seed forward: 47,412 -> 47,104 warp
// instructions a warp).
__device__ __forceinline__ unsigned simt_inside_run(int start, int extent, int k) {
  const unsigned lo = start >= 0 ? 0u : 0u - (unsigned)start;
  const unsigned hi = start >= extent ? 0u : min((unsigned)k, (unsigned)extent - (unsigned)start);
  return lo < hi ? (1u << hi) - (1u << lo) : 0u;
}

template <typename T, typename I, int BM, int BN, int THREADS> struct SimtForward {
  static constexpr bool ASYNC = CUPYCONV_HAS_CP_ASYNC;  // operands by cp.async (sm_80+), else register-staged
  static constexpr int BK = simt_fwd_chunk(ASYNC, BM, BN);
  static constexpr int STAGES = !ASYNC ? 2 : BK == SIMT_BK ? SIMT_ASYNC_STAGES : 2;
  typedef SimtLoad<BM, THREADS, true, BK> LoadA;
  typedef SimtLoad<BN, THREADS, true, BK> LoadB;
  typedef typename Unsigned<I>::type U;
  static constexpr bool SUMS_B = false, ASYNC_A = false;  // (ASYNC: both operands by cp.async)
  static_assert(sizeof(T) == 4, "4-byte copies of float elements");
  // Whether a k slot reads its whole entry and moves on by it, or the two-warp tiles' way (128 x 32 x 8,
  // 256 x 32 x 16: 4-8 slots a thread and chunk, the others 1-4): the head, with a carry.  A whole entry is 4
  // shared-memory wavefronts to the head's 2, and the model put p-seed's input gradient on 128 x 32 x 8 at 295.7-
  // 418.3 us with it against 283.7-435.5 (sm_90: 1,356 loop instructions, not 1,415): its low end binds there.
  static constexpr bool NEXT_ENTRY = THREADS >= 128;
  const T* x; const T* weight_t; const T* bias; T* out;
  const SimtTap<I>* tap_table;  // taps entries, in shared memory
  I M, pixels;
  U x_stride_c, channel_step;  // channel_step: BK / taps channels (!NEXT_ENTRY)
  int N, K, taps, g, n0, groups;
  int entry_step, table_bytes;  // BK % taps entries and taps, in bytes (!NEXT_ENTRY)
  int b_rows, b_stride;  // weight_t's padded rows (K to SIMT_WEIGHT_K_ALIGN) and columns (N to whole tiles)
  bool has_bias, rows_in_fours;  // rows_in_fours: planes of 4k pixels, out 16-byte aligned
  I row_origin[LoadA::ROW_SLOTS];          // this thread's output pixels: their window's origin,
  unsigned row_outside[LoadA::ROW_SLOTS];  // and the complement of their mask (all ones past M)

  // k = (c, tap); x: the element of a window origin 0 (+ row_origin: the pixel's); channel and entry (the table's,
  // a byte offset) are k's, or with NEXT_ENTRY k + BK's once placed: a_place reads k's entry, which says where the
  // slot goes next
  struct ACursor { int k, entry; U channel; const T* x; unsigned bits; };
  __device__ void a_place(ACursor& at) const {
    const char* entry = reinterpret_cast<const char*>(tap_table) + at.entry;
    SimtTap<I> tap;
    if constexpr (NEXT_ENTRY) {
      tap = *reinterpret_cast<const SimtTap<I>*>(entry);
    } else {
      const SimtTapHead<I> head = *reinterpret_cast<const SimtTapHead<I>*>(entry);
      tap.offset = head.offset, tap.bits = head.bits;
    }
    at.x = x + (I)(at.channel + tap.offset);
    at.bits = at.k < K ? tap.bits : SIMT_PAST_K;
    if constexpr (NEXT_ENTRY) {
      at.channel += tap.step;
      at.entry = tap.next;
    }
  }
  __device__ ACursor a_start(I k) const {  // the division: once per k slot, before the loop
    ACursor at;
    at.k = (int)k;
    at.entry = at.k % taps * (int)sizeof(SimtTap<I>);
    at.channel = (U)(at.k / taps) * x_stride_c;
    a_place(at);
    return at;
  }
  __device__ void a_advance(ACursor& at) const {
    at.k += BK;
    if constexpr (!NEXT_ENTRY) {
      at.entry += entry_step;
      at.channel += channel_step;
      if (at.entry >= table_bytes) {
        at.entry -= table_bytes;
        at.channel += x_stride_c;
      }
    }
    a_place(at);
  }
  __device__ float a(const ACursor& at, int rs) const {
    // A select, not a return before the load: the load is predicated on the AND.
    return (at.bits & row_outside[rs]) == 0 ? to_acc(at.x[row_origin[rs]]) : 0.0f;
  }
  __device__ void a_copy(float* dst, const ACursor& at, int rs) const {  // a(at, rs) into dst, by cp.async
    const bool inside = (at.bits & row_outside[rs]) == 0;
    cp_async_ca_4(dst, at.x + row_origin[rs], inside ? 4 : 0);
  }
  // B: weight_t is zero-padded to whole K chunks and column tiles (b_rows x b_stride a group, 16-byte aligned:
  // cupyconv/ops/simt_gemm.py `simt_weight_t`), so no load of it is predicated; the zeros past K meet A's zeros
  // there and those past N feed columns never stored: the same sums.
  struct BCursor { const T* row; };  // weight_t's row k at the thread's first column
  __device__ BCursor b_start(I k) const { return {weight_t + ((I)g * b_rows + k) * b_stride + n0 + LoadB::row(0)}; }
  __device__ void b_advance(BCursor& at) const { at.row += (I)BK * b_stride; }
  __device__ float b(const BCursor& at, int rs) const { return to_acc(at.row[32 * rs]); }  // row(rs) = row(0) + 32 rs
  // With cp.async, a chunk of B (BK rows of BN) goes by B_VECS 16-byte copies a thread, none predicated, not
  // BK * BN / THREADS 4-byte ones with a predicate each (sm_90 192 x 64 x 12: 8 -> 2 LDGSTS a chunk of 16): the
  // lanes along n, the thread's first at row b_k() and column b_c() of the chunk, its others B_K_STEP rows further
  // each.  Its cursor is the index of that first element (b_chunk_start): an index, not a pointer, is one register
  // fewer (int), which kept 128 x 64 x 8 at 128 registers (127; 130 with a pointer).
  static constexpr int B_VECS = BK * BN / (4 * THREADS), B_K_STEP = 4 * THREADS / BN;
  static_assert(B_VECS >= 1 && 4 * THREADS % BN == 0, "whole 16-byte copies of B's chunk, rows by whole passes");
  __device__ static int b_k() { return threadIdx.x / (BN / 4); }
  __device__ static int b_c() { return 4 * (threadIdx.x % (BN / 4)); }
  __device__ I b_chunk_start(I k) const { return ((I)g * b_rows + k + b_k()) * b_stride + n0 + b_c(); }
  __device__ void b_chunk_advance(I& at) const { at += (I)BK * b_stride; }
  __device__ void b_copy_chunk(float* stage, I at) const {  // at: b_chunk_start's index, moved on
    float* dst = stage + b_k() * (BN + SIMT_PAD) + b_c();
    const T* src = weight_t + at;
#pragma unroll
    for (int v = 0; v < B_VECS; ++v) {
      cp_async_cg_16(dst + v * B_K_STEP * (BN + SIMT_PAD), src + v * B_K_STEP * b_stride, 16);
    }
  }
  __device__ I out_row(I m) const {  // where row m = (image, pixel) of group g starts in out (n, groups * N, pixels)
    const I image = m / pixels;
    return (image * groups + g) * (I)N * pixels + (m - image * pixels);
  }
  __device__ float column_bias(int n) const { return to_acc(bias[g * N + n]); }
  __device__ void store(I row, int n, float value) const { out[row + (I)n * pixels] = from_acc<T>(value); }
  __device__ void store4(I row, int n, float4 value) const {  // T is float: simt_fwd is strict float32
    *reinterpret_cast<float4*>(out + row + (I)n * pixels) = value;
  }
};

// 128 x 64 x 8 runs four blocks of 128 threads an SM (cupyconv/ops/simt_gemm.py SIMT_BLOCKS_AN_SM, held by
// tests/test_sass.py): at most 128 registers, which ptxas kept by itself until B went by 16-byte copies (151 at
// sm_90 without this bound).  Two blocks of the bound's SIMT_MAX_THREADS are the same 512 threads an SM.
template <int BM, int BN, int TM>
constexpr int simt_fwd_min_blocks = BM == 128 && BN == 64 && TM == 8 ? 512 / SIMT_MAX_THREADS : 1;
template <typename T, typename I, int BM, int BN, int TM>
__global__ void __launch_bounds__(SIMT_MAX_THREADS, simt_fwd_min_blocks<BM, BN, TM>) simt_fwd(
    const T* __restrict__ x, const T* __restrict__ weight_t, const T* __restrict__ bias, T* __restrict__ out, I n,
    I x_inner, I x_stride_outer, I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
    int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w, int stride_h,
    int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w, int has_bias) {
  typedef SimtForward<T, I, BM, BN, BM * BN / (TM * 8)> F;
  typedef typename F::U U;
  __shared__ __align__(16) float as[F::STAGES * F::BK * (BM + SIMT_PAD)];  // [stage][k][row]
  __shared__ __align__(16) float bs[F::STAGES * F::BK * (BN + SIMT_PAD)];
  __shared__ SimtTap<I> tap_table[SIMT_MAX_TAPS];
  F f;
  const int n_tiles = (outputs_per_group + BN - 1) / BN, taps = kernel_h * kernel_w;
  for (int t = threadIdx.x; t < taps; t += blockDim.x) {
    const int i = t / kernel_w, j = t - i * kernel_w;
    const U offset = (U)(i * dilation_h) * (U)x_stride_h + (U)(j * dilation_w) * (U)x_stride_w;
    const int ahead = t + F::BK;  // the tap BK k further, in this channel or a later one
    tap_table[t] = {offset, 1u << j | 1u << (kernel_w + i), ahead % taps * (int)sizeof(SimtTap<I>),
                    (U)(ahead / taps) * (U)x_stride_c};
  }
  f.x = x; f.weight_t = weight_t; f.bias = bias; f.out = out; f.tap_table = tap_table;
  f.pixels = (I)out_h * out_w; f.M = n * f.pixels; f.N = outputs_per_group;
  f.taps = taps; f.K = channels_per_group * taps;
  f.b_rows = (f.K + SIMT_WEIGHT_K_ALIGN - 1) / SIMT_WEIGHT_K_ALIGN * SIMT_WEIGHT_K_ALIGN; f.b_stride = n_tiles * BN;
  f.x_stride_c = (U)x_stride_c; f.channel_step = (U)(F::BK / taps) * (U)x_stride_c;
  f.entry_step = F::BK % taps * (int)sizeof(SimtTap<I>); f.table_bytes = taps * (int)sizeof(SimtTap<I>);
  f.groups = groups; f.has_bias = has_bias;
  f.rows_in_fours = f.pixels % 4 == 0 && reinterpret_cast<size_t>(out) % 16 == 0;
  f.g = blockIdx.y / n_tiles; f.n0 = blockIdx.y % n_tiles * BN;
  const I m0 = (I)blockIdx.x * BM;
  const BatchView<I> view = {x_inner, x_stride_outer, x_stride_inner};
#pragma unroll
  for (int r = 0; r < F::LoadA::ROW_SLOTS; ++r) {
    const WindowRow<I> row = window_row<I>(m0 + F::LoadA::row(r), f.M, f.pixels, view,
                                           (I)(f.g * channels_per_group) * x_stride_c, out_w, stride_h, stride_w,
                                           pad_top, pad_left, x_stride_h, x_stride_w);
    unsigned inside = 0;  // rows past M: none (window_row puts them 2^30 rows above the image)
    if (dilation_h == 1 && dilation_w == 1) {  // runs of positions, no loop over the window's
      inside = simt_inside_run(row.x, width, kernel_w) | simt_inside_run(row.y, height, kernel_h) << kernel_w;
    } else {
      for (int j = 0; j < kernel_w; ++j) inside |= (unsigned)(row.x + j * dilation_w) < (unsigned)width ? 1u << j : 0u;
      for (int i = 0; i < kernel_h; ++i) {
        inside |= (unsigned)(row.y + i * dilation_h) < (unsigned)height ? 1u << (kernel_w + i) : 0u;
      }
    }
    f.row_origin[r] = (I)row.origin;  // the sum with a k slot's offset is the element's, exactly
    f.row_outside[r] = ~inside;
  }
  __syncthreads();  // the tap table
  simt_block<I, BM, BN, TM>(f, as, bs, m0, f.n0, (I)0, (I)f.K);
}

// Weight gradient, transposed: C = grad_weight^T of the group, rows (c, tap), columns d, reduced over the output
// pixels k = (image, p).  A = x gathered per (c, tap) row and B = grad_out rows, both with the lanes on the
// pixels (coalesced along an output row).  Block z of the grid reduces split z: chunks_per_split chunks of
// SIMT_BK pixels, written as float to partial (splits, D * C / G * taps + bias_row * D): per split the weight in its
// own layout (D, C / G, kH, kW), then with bias_row 1 the bias gradient (D), the column sums of B that the blocks
// of row tile 0 loaded (SUMS_B: no GEMM row of ones, no separate pass over grad_out).  So the launcher's sum of the
// splits holds grad_weight and grad_bias each contiguous: views, no copies out of an interleaved bias row.
template <typename T, typename I, int BM, int BN, int THREADS> struct SimtWeightGrad {
  typedef SimtLoad<BM, THREADS, false> LoadA;
  typedef SimtLoad<BN, THREADS, false> LoadB;
  typedef typename Unsigned<I>::type U;
  static constexpr bool SUMS_B = true;
  // B register-staged (summed as loaded: SUMS_B), A by cp.async on sm_80+ (no staging register, store or zeroing)
  static constexpr bool ASYNC = false, ASYNC_A = CUPYCONV_HAS_CP_ASYNC;
  static constexpr int BK = SIMT_BK, STAGES = 2;
  const T* x; const T* grad_out; float* partial;
  BatchView<I> view;
  I n, out_pixels, x_stride_c, x_stride_h, x_stride_w, split_base, group_base;
  int M, N, n0, g, groups, stride_h, stride_w, pad_top, pad_left, height, width;
  I bias_base;     // where this split's bias sums of the group start: after the split's D weight rows of M
  bool sums_b;     // this block writes the bias gradient of its columns (row tile 0, with a bias)
  FastDivmod out_w;
  WindowTap<I> rows[LoadA::ROW_SLOTS];  // this thread's rows (c, i, j) of A, decoded once (past M: as row 0)

  struct ACursor { SimtPixel<I> at; I image_start; U origin; int y0, x0; };  // the window of pixel `at` in x
  // grad_out's element (image, n0 + LoadB::row(0), p) at pixel `at`, placed once a chunk: a row slot rs adds
  // rs * b_row_step (its output channel is PER_PASS rs further), one wide multiply-add an element, not the whole
  // index, and grad_out is not reloaded per element (sm_90 96 x 64 x 12: 1,107 -> 1,084 loop instructions, 209 ->
  // 201 registers).  The index in unsigned arithmetic: past the last image (never read) it may wrap.
  struct BCursor { SimtPixel<I> at; const T* row; };
  U b_row_step;  // LoadB::PER_PASS * out_pixels
  __device__ void a_place(ACursor& cursor) const {  // the window's origin and position from the cursor's pixel
    int ox;
    const int oy = out_w.divmod(cursor.at.p, ox);
    cursor.y0 = oy * stride_h - pad_top;
    cursor.x0 = ox * stride_w - pad_left;
    cursor.origin = (U)cursor.image_start + (U)cursor.y0 * (U)x_stride_h + (U)cursor.x0 * (U)x_stride_w;
  }
  __device__ ACursor a_start(I k) const {
    ACursor cursor;
    cursor.at.image = k / out_pixels;  // once per kernel
    cursor.at.p = (int)(k - cursor.at.image * out_pixels);
    cursor.image_start = cursor.at.image < n ? view.image(cursor.at.image) + group_base : (I)0;
    a_place(cursor);
    return cursor;
  }
  __device__ void a_advance(ACursor& cursor) const {
    const I image = cursor.at.image;
    cursor.at.advance((int)out_pixels);
    if (cursor.at.image != image) {  // a new image: its start (a division, once an image)
      cursor.image_start = cursor.at.image < n ? view.image(cursor.at.image) + group_base : (I)0;
    }
    a_place(cursor);
  }
  __device__ float a(const ACursor& cursor, int rs) const {
    // A select, not a return before the load: sm_90 predicates each element's load instead of branching around
    // it.  Rows past M read row 0's tap: never stored.
    const int y = cursor.y0 + rows[rs].dy, xx = cursor.x0 + rows[rs].dx;  // unsigned compares: also false below 0
    const bool inside = cursor.at.image < n && (unsigned)y < (unsigned)height && (unsigned)xx < (unsigned)width;
    return inside ? to_acc(x[(I)(cursor.origin + rows[rs].offset)]) : 0.0f;
  }
  __device__ void a_copy(float* dst, const ACursor& cursor, int rs) const {  // a(cursor, rs) into dst, by cp.async
    const int y = cursor.y0 + rows[rs].dy, xx = cursor.x0 + rows[rs].dx;
    const bool inside = cursor.at.image < n && (unsigned)y < (unsigned)height && (unsigned)xx < (unsigned)width;
    cp_async_ca_4(dst, x + (I)(cursor.origin + rows[rs].offset), inside ? 4 : 0);
  }
  __device__ void b_place(BCursor& cursor) const {
    cursor.row = grad_out + (I)(((U)cursor.at.image * (U)groups + (U)g) * (U)N * (U)out_pixels +
                                (U)(n0 + LoadB::row(0)) * (U)out_pixels + (U)cursor.at.p);
  }
  __device__ BCursor b_start(I k) const {
    BCursor cursor;
    cursor.at.image = k / out_pixels;
    cursor.at.p = (int)(k - cursor.at.image * out_pixels);
    b_place(cursor);
    return cursor;
  }
  __device__ void b_advance(BCursor& cursor) const {
    cursor.at.advance((int)out_pixels);
    b_place(cursor);
  }
  __device__ float b(const BCursor& cursor, int rs) const {
    if (n0 + LoadB::row(rs) >= N || cursor.at.image >= n) return 0.0f;
    return to_acc(cursor.row[(I)((U)rs * b_row_step)]);
  }
  __device__ I out_row(I m) const { return split_base + (I)(g * N) * M + m; }
  // Scalar stores only: the float4 path (M 4k) cost the 32- and 64-column tiles 28-38 registers, an
  // occupancy step, for an epilogue that is a small part of a weight gradient's long reduction.
  static constexpr bool has_bias = false, rows_in_fours = false;  // (its bias gradient: SUMS_B)
  __device__ float column_bias(int) const { return 0.0f; }
  __device__ void store(I row, int n, float value) const { partial[row + (I)n * M] = value; }
  __device__ void store4(I, int, float4) const {}
  __device__ void store_b_sum(int n, float sum) const { partial[bias_base + n] = sum; }
};

// simt_bwd_weight's threads (its tiles' most: 128) and the blocks an SM must hold: 192 x 64 x 12 with int
// indices three, 12 warps (168 registers, none spilled, 9 more loop instructions than at 201), which its plans
// launch in waves of three an SM (SIMT_FIT_WEIGHT_BLOCKS), so that each scheduler has a third warp to issue while
// two wait for the shared loads that follow a barrier; its 64-bit twin would spill there and keeps two, and so
// does sm_70, whose A goes through 12 more staging registers.
constexpr int SIMT_WEIGHT_THREADS = 128;
template <typename I, int BM, int BN, int TM>
constexpr int simt_weight_min_blocks =
    CUPYCONV_HAS_CP_ASYNC && sizeof(I) == 4 && BM == 192 && BN == 64 && TM == 12 ? 3 : 1;

template <typename T, typename I, int BM, int BN, int TM>
__global__ void __launch_bounds__(SIMT_WEIGHT_THREADS, simt_weight_min_blocks<I, BM, BN, TM>) simt_bwd_weight(
    const T* __restrict__ x, const T* __restrict__ grad_out, float* __restrict__ partial, I n, I x_inner,
    I x_stride_outer, I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
    int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w, int stride_h,
    int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w,
    I chunks_per_split, int bias_row) {
  typedef SimtWeightGrad<T, I, BM, BN, BM * BN / (TM * 8)> F;
  __shared__ __align__(16) float as[F::STAGES * SIMT_BK * (BM + SIMT_PAD)];
  __shared__ __align__(16) float bs[F::STAGES * SIMT_BK * (BN + SIMT_PAD)];
  F f;
  const int n_tiles = (outputs_per_group + BN - 1) / BN;
  f.x = x; f.grad_out = grad_out; f.partial = partial; f.n = n;
  f.view.inner = x_inner; f.view.stride_outer = x_stride_outer; f.view.stride_inner = x_stride_inner;
  f.out_pixels = (I)out_h * out_w;
  f.b_row_step = (typename F::U)F::LoadB::PER_PASS * (typename F::U)f.out_pixels;
  f.x_stride_c = x_stride_c; f.x_stride_h = x_stride_h; f.x_stride_w = x_stride_w;
  const int taps_rows = channels_per_group * kernel_h * kernel_w;
  f.M = taps_rows; f.N = outputs_per_group;
  f.sums_b = bias_row && blockIdx.x == 0;
  f.groups = groups;
  f.stride_h = stride_h; f.stride_w = stride_w; f.pad_top = pad_top; f.pad_left = pad_left;
  f.height = height; f.width = width; f.out_w = FastDivmod(out_w);
  f.g = blockIdx.y / n_tiles; f.n0 = blockIdx.y % n_tiles * BN;
  f.group_base = (I)(f.g * channels_per_group) * x_stride_c;
  f.split_base = (I)blockIdx.z * groups * outputs_per_group * (taps_rows + bias_row);  // a split's slice
  f.bias_base = f.split_base + (I)groups * outputs_per_group * taps_rows + f.g * outputs_per_group;
  const int m0 = blockIdx.x * BM;
  const FastDivmod taps(kernel_h * kernel_w), kernel_wd(kernel_w);
#pragma unroll
  for (int r = 0; r < F::LoadA::ROW_SLOTS; ++r) {
    const int m = m0 + F::LoadA::row(r);
    f.rows[r] = decode_tap<I>(m < taps_rows ? m : 0, taps, kernel_wd, dilation_h, dilation_w, x_stride_c, x_stride_h,
                            x_stride_w);
  }
  const I total = n * f.out_pixels;
  const I k_begin = (I)blockIdx.z * chunks_per_split * SIMT_BK;
  const I k_end = k_begin + chunks_per_split * SIMT_BK < total ? k_begin + chunks_per_split * SIMT_BK : total;
  simt_block<I, BM, BN, TM>(f, as, bs, (I)m0, f.n0, k_begin, k_end);
}
