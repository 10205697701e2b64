// Self-test kernels of raw_kernels/async_copy.cuh on the emulator (tests/test_emulator_async_copy.py): each uses
// cp.async or ldmatrix correctly unless `bug` asks it to break one rule.  Not shipped, never compiled by NVRTC
// (tests/test_nvrtc.py compiles the header itself for the GPU).
#include "../../../raw_kernels/async_copy.cuh"

enum Bug {
  CORRECT = 0,
  NO_WAIT = 1,           // reads a stage without waiting for it
  WAIT_TOO_FEW = 2,      // cp.async.wait_group 2 where 1 is needed: the stage read is still in flight
  MISALIGNED_SMEM = 3,   // a shared destination half a copy off its size's boundary
  MISALIGNED_GMEM = 4,
  SRC_BYTES_17 = 5,      // src-size larger than the copy (17 for 16 bytes, 9 for 8, 5 for 4)
  FULL_ROW_PAST_END = 6, // a padding row copied with src-size 16 instead of 0: reads past the input
  NO_COMMIT = 7,         // waits without committing: the copies are in no group, nothing lands
  REISSUE = 8,           // a second copy into bytes still in flight
  NOT_SHARED = 9,        // a destination in the thread's local memory, not in shared memory
  INTO_TAIL = 10,        // a 4-byte copy into the last word of a larger copy still in flight
  STORE_IN_FLIGHT = 11,  // a plain store into the next step's stage, whose copies are in flight
};

// rows x 16 bytes from `in` to `out` through three stages of shared memory, 32 rows (one per thread) a step, the
// copy of step t + 2 in flight while step t is read, each row by 16 / size copies of `size` bytes (16: .cg, 8 and
// 4: .ca).  Each thread reads the row its neighbour copied (so the barrier after the wait matters too).  Rows past
// `rows` are zero-filled padding (src-size 0), row `rows` - 1 is copied with `last_bytes` bytes of source (its
// copies take what is left of them, the rest zero-filled).
__global__ void async_copy_stages(const unsigned char* in, unsigned char* out, int rows, int last_bytes,
                                  int steps, int bug, int size) {
  __shared__ __align__(16) unsigned char stage[3][32][16];
  __align__(16) unsigned char local[16];  // NOT_SHARED's destination
  const int tid = threadIdx.x;
  auto copy = [&](unsigned char* dst, const unsigned char* src, int bytes) {
    if (size == 16) cp_async_cg_16(dst, src, bytes);
    else if (size == 8) cp_async_ca_8(dst, src, bytes);
    else cp_async_ca_4(dst, src, bytes);
  };
  auto issue = [&](int t) {
    if (t < steps) {
      const int r = t * 32 + tid;
      const int row_bytes = r < rows - 1 ? 16 : (r == rows - 1 ? last_bytes : 0);
      for (int at = 0; at < 16; at += size) {
        int bytes = row_bytes - at < 0 ? 0 : (row_bytes - at > size ? size : row_bytes - at);
        if (bug == SRC_BYTES_17 && r == 0) bytes = size + 1;
        if (bug == FULL_ROW_PAST_END && r >= rows) bytes = size;
        unsigned char* dst = stage[t % 3][tid] + at + (bug == MISALIGNED_SMEM && r == 5 ? size / 2 : 0);
        if (bug == NOT_SHARED && r == 5) dst = local + at;
        const unsigned char* src = in + 16 * (long long)(r < rows ? r : rows) + at +
                                   (bug == MISALIGNED_GMEM && r == 5 ? size / 2 : 0);
        copy(dst, src, bytes);
        if (bug == REISSUE && r == 3) copy(dst, src, bytes);
        if (bug == INTO_TAIL && r == 3) cp_async_ca_4(dst + size - 4, src + size - 4, 4);
      }
    }
    if (bug != NO_COMMIT) cp_async_commit();
  };
  issue(0);
  issue(1);
  for (int t = 0; t < steps; ++t) {
    if (bug == WAIT_TOO_FEW) cp_async_wait<2>();
    else if (bug != NO_WAIT) cp_async_wait<1>();  // step t's group; step t + 1's may stay in flight
    __syncthreads();
    const int neighbour = (tid + 1) % 32;
    for (int b = 0; b < 16; ++b) out[16 * (t * 32 + neighbour) + b] = stage[t % 3][neighbour][b];
    if (bug == STORE_IN_FLIGHT && t + 1 < steps && tid == 7) stage[(t + 1) % 3][12][size - 1] = 0;
    __syncthreads();  // every read of stage t % 3 before step t + 3 is copied into it
    issue(t + 2);
  }
  cp_async_wait<0>();
}

// One ldmatrix of the warp (mode 0: .x4, 1: .x2, 2: .x4.trans) from a 32-row tile of 16-bit values in shared
// memory, `pitch` elements between rows: lane l gives the address of tile row rows[l] (+ `offset` elements for
// lane `odd_lane`); out[4 l + j] = the lane's register j.  Only lanes below `lanes` reach the instruction.
__global__ void ldmatrix_rows(const unsigned short* tile_in, const int* rows, unsigned* out, int pitch, int mode,
                              int lanes, int odd_lane, int offset) {
  __shared__ __align__(16) unsigned short tile[32 * 24];
  for (int i = threadIdx.x; i < 32 * pitch; i += blockDim.x) tile[i] = tile_in[i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const unsigned short* row = tile + rows[lane] * pitch + (lane == odd_lane ? offset : 0);
  unsigned r[4] = {0, 0, 0, 0};
  if (lane < lanes) {
    if (mode == 0) {
      ldmatrix_x4(r, row);
    } else if (mode == 1) {
      unsigned r2[2];
      ldmatrix_x2(r2, row);
      r[0] = r2[0];
      r[1] = r2[1];
    } else {
      ldmatrix_x4_trans(r, row);
    }
  }
  for (int j = 0; j < 4; ++j) out[4 * threadIdx.x + j] = r[j];
}

// cp.async of a 32 x 8 tile of 16-bit values (a row per lane, in two groups: rows 0-15, then 16-31) and an
// ldmatrix_x4 of it: `wait` groups left in flight before the barrier (0: correct; 1: the second group's rows are
// still in flight; -1: no wait at all).
__global__ void async_copy_ldmatrix(const unsigned short* in, unsigned* out, int wait) {
  __shared__ __align__(16) unsigned short tile[32 * 8];
  const int lane = threadIdx.x;
  if (lane < 16) cp_async_cg_16(tile + 8 * lane, in + 8 * lane, 16);
  cp_async_commit();
  if (lane >= 16) cp_async_cg_16(tile + 8 * lane, in + 8 * lane, 16);
  cp_async_commit();
  if (wait == 0) cp_async_wait<0>();
  if (wait == 1) cp_async_wait<1>();
  __syncthreads();
  unsigned r[4];
  ldmatrix_x4(r, tile + 8 * lane);
  for (int j = 0; j < 4; ++j) out[4 * lane + j] = r[j];
  cp_async_wait<0>();
}

// A row of 16 bytes a thread copied by cp.async into dynamic shared memory, landed, then read back from `shift`
// bytes further (0: its own row): the launch must give at least 16 x blockDim.x + shift bytes.
__global__ void async_copy_dynamic(const unsigned char* in, unsigned char* out, int shift) {
  extern __shared__ __align__(16) unsigned char rows_s[];
  const int tid = threadIdx.x;
  cp_async_cg_16(rows_s + 16 * tid, in + 16 * tid, 16);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int b = 0; b < 16; ++b) out[16 * tid + b] = rows_s[16 * tid + b + shift];
}
