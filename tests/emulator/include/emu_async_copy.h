// Stand-in for raw_kernels/async_copy.cuh in the CPU emulator: cp.async with its groups and waits, and ldmatrix
// as a warp collective, with the hardware's rules.
//
// cp.async (cp_async_cg_16, cp_async_ca_8, cp_async_ca_4: a copy of 16, 8 or 4 bytes): both addresses must be
// aligned to the copy's size, the destination in shared memory and src_bytes within 0..size, or the launch fails.
// The source bytes are read at the call (an out-of-bounds source is an ASan report, as it is a fault on a GPU),
// the destination's bytes are poisoned (0xFF) and the copy is noted as in flight with the thread's open group.
// cp_async_commit closes the group; cp_async_wait<N> lands (writes to shared memory) every copy of the calling
// thread whose group is committed and older than its N most recent committed groups.  Copies of groups never
// committed, or never waited for, never land.  So a missing or too weak wait leaves poison where the data should
// be (a float read there is a NaN), a read of it by ldmatrix fails the launch, naming the copy that is still in
// flight, and a new copy into bytes that another copy still has in flight fails too (the hardware orders neither),
// as does any plain load or store of them in the plain build of a file that uses cp.async (emu_runtime.h's
// shared_access; the ASan build has only the poison).
//
// Memory counters (EmulatedDevice(counters=True)): a full copy's source is read by one typed access of its size
// (a global load of its cp.async call's line), its landing is a shared store of its size at the wait's line, and
// ldmatrix's reads are the lanes' 4-byte words of each matrix (one request, one wavefront when conflict-free, per
// matrix: what the hardware issues).
//
// ldmatrix (ldmatrix_x4, _x2, _x4_trans): all 32 lanes of a full warp reach the same call (a warp of a block
// whose size is not a multiple of 32, or lanes elsewhere, fail the launch like mma.sync); each address lane
// (lanes 0-31 for .x4, 0-15 for .x2) must give a 16-byte-aligned row none of whose bytes is in flight.  Lane l
// then receives, through the warp's shuffles, the words of the PTX ISA's layout (raw_kernels/async_copy.cuh).
#pragma once

namespace emu {
// emu_runtime.h: stops the calling thread and fails the launch with `what`, the thread and file:line.
void thread_failure(const char* file, int line, const char* what);
// emu_runtime.h: whether any of the bytes at p lies in the dynamic shared memory past the launch's size.
bool past_the_launch(const void* p, int bytes);
// emu_runtime.h: the calling thread's copies landed (generic-proxy writes a wgmma sees only after a proxy fence).
void copies_landed();

constexpr int kAsyncWord = 4;  // the smallest cp.async: the in-flight map's granule

struct AsyncCopy {
  unsigned char* dst;
  unsigned char data[16];
  int size;  // 4, 8 or 16 bytes
  long long group;
  const char* file;
  int line;
};
struct ThreadCopies {
  AsyncCopy* items;
  int count, capacity;
  long long open_group;  // the group new copies join; committed groups are those below it
};
inline ThreadCopies async_copies[1024];  // per thread of the running block (linear thread index)

// Which copy has a word in flight: one entry per 4-byte word of the block's shared memory, 0 or 1 + the rank of
// the thread whose copy into it is in flight.  Every copy's destination is aligned to its size (checked first),
// so it covers whole words, and no two copies can be in flight into one word (the second fails), so one look-up
// per word answers what a scan of every thread's copies would, at a cost that does not grow with the block and
// the pipeline's depth.  A copy sets its words' entries, its landing clears them; copies that never land are
// cleared before the next block.
struct InFlightMap {
  uintptr_t base;          // shared memory's first byte, rounded down to 16
  size_t words;
  unsigned short* owner;   // malloc'd, outside the TLS block: not shared memory, never poisoned or counted
};
inline InFlightMap in_flight_map;

inline int thread_rank() { return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); }

// The entry of the word that holds p, or nullptr outside shared memory.
inline unsigned short* in_flight_entry(const void* p) {
  const uintptr_t offset = (uintptr_t)p - in_flight_map.base;
  return (uintptr_t)p >= in_flight_map.base && offset / kAsyncWord < in_flight_map.words
             ? &in_flight_map.owner[offset / kAsyncWord]
             : nullptr;
}

// Sets (owner: 1 + a thread's rank) or clears (0) the entries of a copy's words.
inline void mark_in_flight(const AsyncCopy& c, unsigned short owner) {
  for (int w = 0; w < c.size; w += kAsyncWord) *in_flight_entry(c.dst + w) = owner;
}

// Called by the engine before each grid with its shared memory, [begin, end).
inline void async_copy_set_shared(const void* begin, const void* end) {
  const uintptr_t base = (uintptr_t)begin & ~(uintptr_t)15;
  const size_t words = ((uintptr_t)end - base + 15) / 16 * (16 / kAsyncWord);
  if (base != in_flight_map.base || words != in_flight_map.words) {
    free(in_flight_map.owner);
    in_flight_map.owner = (unsigned short*)calloc(words, sizeof(unsigned short));
    if (!in_flight_map.owner) abort();
    in_flight_map.base = base;
    in_flight_map.words = words;
  }
}

// Called by the engine before each block: nothing is in flight (the copies a failed or careless block left are
// forgotten, their entries cleared).
inline void async_copy_begin_block() {
  for (ThreadCopies& t : async_copies) {
    for (int i = 0; i < t.count; ++i) mark_in_flight(t.items[i], 0);
    t.count = 0;
    t.open_group = 0;
  }
}

// The copy (of any thread of the block) in flight into one of the `bytes` bytes at p (whole words), or nullptr;
// *owner its thread, *at the first such byte.
inline const AsyncCopy* async_copy_in_flight(const void* p, int bytes, int* owner, const void** at) {
  for (int w = 0; w < bytes; w += kAsyncWord) {
    const unsigned char* word = (const unsigned char*)p + w;
    const unsigned short* e = in_flight_entry(word);
    if (!e || !*e) continue;
    *owner = *e - 1;
    *at = word;
    const ThreadCopies& t = async_copies[*owner];
    for (int i = 0; i < t.count; ++i)
      if (t.items[i].dst <= word && word < t.items[i].dst + t.items[i].size) return &t.items[i];
    abort();  // the map and the owner's list disagree: a bug of this file
  }
  return nullptr;
}

inline void async_copy_failure(const char* file, int line, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
inline void async_copy_failure(const char* file, int line, const char* format, ...) {
  char what[512];
  va_list args;
  va_start(args, format);
  vsnprintf(what, sizeof what, format, args);
  va_end(args);
  thread_failure(file, line, what);
}

inline void in_flight_failure(const char* file, int line, const char* op, const void* p, const AsyncCopy* c,
                              int owner) {
  async_copy_failure(file, line, "%s of shared memory at %p that a cp.async of thread %d (at %s:%d) still has in "
                     "flight (no cp.async.wait_group has landed it yet)", op, p, owner, c->file, c->line);
}

// One cp.async of `size` bytes (4, 8 or 16), src_bytes of them read from gmem and the rest zero-filled.
inline void async_copy(void* smem, const void* gmem, int size, int src_bytes, const char* file, int line) {
  if ((uintptr_t)smem % size || (uintptr_t)gmem % size)
    async_copy_failure(file, line, "cp.async of %d bytes from %p to %p: both addresses must be %d-byte aligned "
                       "(a GPU faults: misaligned address)", size, gmem, smem, size);
  if (src_bytes < 0 || src_bytes > size)
    async_copy_failure(file, line, "cp.async of %d bytes with src-size %d: it must be within 0..%d", size, src_bytes,
                       size);
  unsigned char* dst = (unsigned char*)smem;
  if (!in_flight_entry(dst) || !in_flight_entry(dst + size - 1))
    async_copy_failure(file, line, "cp.async to %p, which is not shared memory (cp.async.shared.global writes "
                       "shared memory only)", smem);
  if (past_the_launch(dst, size))
    async_copy_failure(file, line, "cp.async to %p, past the dynamic shared memory the launch asked for (a GPU "
                       "faults: illegal address)", smem);
  int owner;
  const void* at;
  if (const AsyncCopy* c = async_copy_in_flight(dst, size, &owner, &at)) {
    char op[64];
    snprintf(op, sizeof op, "cp.async into %d bytes", size);
    in_flight_failure(file, line, op, at, c, owner);
  }
  const int rank = thread_rank();
  ThreadCopies& t = async_copies[rank];
  if (t.count == t.capacity) {
    t.capacity = t.capacity ? 2 * t.capacity : 16;
    t.items = (AsyncCopy*)realloc(t.items, t.capacity * sizeof(AsyncCopy));
    if (!t.items) abort();
  }
  AsyncCopy& c = t.items[t.count++];
  c.dst = dst;
  c.size = size;
  std::memset(c.data, 0, 16);
  if (src_bytes == size) {  // one typed read of the copy's size, which the profile build's counters see as the
                            // global load
    if (size == 16) {
      const uint4 whole = *static_cast<const uint4*>(gmem);
      std::memcpy(c.data, &whole, 16);
    } else if (size == 8) {
      const uint2 whole = *static_cast<const uint2*>(gmem);
      std::memcpy(c.data, &whole, 8);
    } else {
      const unsigned whole = *static_cast<const unsigned*>(gmem);
      std::memcpy(c.data, &whole, 4);
    }
  } else if (src_bytes > 0) {
    std::memcpy(c.data, gmem, src_bytes);  // the rest of the copy: zero-fill
  }
  c.group = t.open_group;
  c.file = file;
  c.line = line;
  mark_in_flight(c, (unsigned short)(rank + 1));
  std::memset(dst, 0xFF, size);  // what the destination holds until the copy lands: poison
}
}  // namespace emu

inline void cp_async_cg_16(void* smem, const void* gmem, int src_bytes, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
  emu::async_copy(smem, gmem, 16, src_bytes, file, line);
}
inline void cp_async_ca_8(void* smem, const void* gmem, int src_bytes, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  emu::async_copy(smem, gmem, 8, src_bytes, file, line);
}
inline void cp_async_ca_4(void* smem, const void* gmem, int src_bytes, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  emu::async_copy(smem, gmem, 4, src_bytes, file, line);
}

inline void cp_async_commit() { ++emu::async_copies[emu::thread_rank()].open_group; }

template <int N> inline void cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group takes a count of groups, 0 or more");
  emu::ThreadCopies& t = emu::async_copies[emu::thread_rank()];
  const long long landed_below = t.open_group - N;  // committed groups older than the N most recent ones
  int kept = 0;
  for (int i = 0; i < t.count; ++i) {
    emu::AsyncCopy& c = t.items[i];
    if (c.group < landed_below) {
      if (kept == i) emu::copies_landed();  // once a wait (kept == i until the first copy lands)
      emu::mark_in_flight(c, 0);  // first: the landing's store below is not an access to bytes in flight
      if (c.size == 16) {  // a constant size each: the landing is one store of the copy's width
        std::memcpy(c.dst, c.data, 16);
      } else if (c.size == 8) {
        std::memcpy(c.dst, c.data, 8);
      } else {
        std::memcpy(c.dst, c.data, 4);
      }
    } else {
      t.items[kept++] = c;
    }
  }
  t.count = kept;
}

namespace emu {
// One ldmatrix of `count` 8 x 8 matrices of 16-bit elements, transposed or not: the calling lane's checks, then
// the warp's shuffles of the row addresses, then the lane's words read from the rows.
inline void ldmatrix(unsigned* r, int count, bool trans, const void* row, const char* file, int line) {
  const int rank = thread_rank(), lane = lane_id();
  const int threads = (int)(blockDim.x * blockDim.y * blockDim.z);
  if (rank - lane + 32 > threads)
    async_copy_failure(file, line, "ldmatrix in a warp of %d threads; it needs all 32 lanes", threads - (rank - lane));
  unsigned char mine[16] = {};  // the row this lane addresses, read once as the hardware does (16 bytes: what
                                // the profile build counts as the ldmatrix line's shared request); the other
                                // lanes take their words from it (a fiber's stack: not counted)
  if (lane < 8 * count) {  // this lane gives a row address: 16 bytes, aligned, landed
    if ((uintptr_t)row % 16)
      async_copy_failure(file, line, "ldmatrix row address %p of lane %d is not 16-byte aligned (a GPU faults: "
                         "misaligned address)", row, lane);
    if (past_the_launch(row, 16))
      async_copy_failure(file, line, "ldmatrix row address %p of lane %d is past the dynamic shared memory the "
                         "launch asked for (a GPU faults: illegal address)", row, lane);
    int owner;
    const void* at;
    if (const AsyncCopy* c = async_copy_in_flight(row, 16, &owner, &at))
      in_flight_failure(file, line, "ldmatrix read", at, c, owner);
    std::memcpy(mine, row, 16);
  }
  const int g = lane >> 2, q = lane & 3;
  for (int j = 0; j < count; ++j) {
    if (!trans) {  // row g of matrix j, elements 2q and 2q + 1
      const unsigned char* p = shuffle(file, line, 0xffffffffu, (const unsigned char*)mine, 8 * j + g);
      std::memcpy(&r[j], p + 4 * q, 4);
    } else {       // column g of matrix j, rows 2q and 2q + 1
      const unsigned char* p0 = shuffle(file, line, 0xffffffffu, (const unsigned char*)mine, 8 * j + 2 * q);
      const unsigned char* p1 = shuffle(file, line, 0xffffffffu, (const unsigned char*)mine, 8 * j + 2 * q + 1);
      unsigned short lo, hi;
      std::memcpy(&lo, p0 + 2 * g, 2);
      std::memcpy(&hi, p1 + 2 * g, 2);
      r[j] = (unsigned)lo | ((unsigned)hi << 16);
    }
  }
  // Every lane has read the rows it needs before any lane leaves (and reuses its `mine` for another ldmatrix).
  (void)shuffle(file, line, 0xffffffffu, 0, lane);
}
}  // namespace emu

inline void ldmatrix_x4(unsigned (&r)[4], const void* row, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  emu::ldmatrix(r, 4, false, row, file, line);
}
inline void ldmatrix_x2(unsigned (&r)[2], const void* row, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  emu::ldmatrix(r, 2, false, row, file, line);
}
inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* row, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  emu::ldmatrix(r, 4, true, row, file, line);
}
