// Emulated memory counters: the "profile" build (tests/emulator/_build.py, EmulatedDevice(counters=True)).
//
// The kernel file is compiled with g++'s -fsanitize=thread instrumentation, which calls __tsan_read<N>(addr) or
// __tsan_write<N>(addr) before every load and store of memory and __tsan_func_entry/exit around every function,
// but the library is linked WITHOUT the ThreadSanitizer runtime: the hooks are emu_runtime.h's (the plain build of
// a file that uses cp.async has them too, for its shared-memory rules), and in this build they call record() here.  It keeps an access when a
// fiber (a CUDA thread) runs and the address lies in shared memory (this library's TLS block, see __shared__ in
// prelude.h) or in the span of a pointer argument (global memory); everything else (the fiber's stack, i.e.
// registers and local memory, and the engine's own data) is ignored, so the runtime's accesses and the kernel's
// locals never count.
//
// A site is the address of the access (the hook's return address) with the three innermost call sites of the
// fiber's shadow call stack (kept from func_entry/exit): Python maps them to the innermost file:line outside
// the emulator's headers (an access inside __half's conversion belongs to the kernel line that converts), and
// distinct callers of one helper are distinct sites, as nvcc's inlining makes distinct instructions of them.
//
// Warp instructions: each fiber logs its accesses; after every pass of the scheduler (every fiber then waits at
// a barrier or a warp operation, or has exited: a warp-wide synchronisation point) the logs of each warp are
// merged, and the k-th execution of a site by each lane within the same calls of its three enclosing call sites
// (calls numbered per call site since that point) forms one request: a lane whose helper skips the access
// still makes the call, so it does not shift its later requests (a GPU issues the predicated instruction).
// Then:
//   global memory: 32-byte sectors and 128-byte lines touched by the request (addresses counted from the
//     argument's allocation, which a GPU aligns to 256 bytes), distinct bytes requested ("useful");
//   shared memory: wavefronts with 32 banks of 4 bytes: lanes that read the same 4-byte word share it
//     (broadcast), distinct words in one bank take one wavefront each; accesses of 8 bytes are served per half
//     warp and of 16 bytes per quarter warp (at least 2 and 4 wavefronts for a full warp), 1 to 4 bytes per warp.
// Not modelled: caches (L1, L2 hits), the order of requests, a request's latency, atomics' own costs.
#pragma once

namespace emu {
namespace counters {

#ifdef EMU_PROFILE
#define EMU_UNINSTRUMENTED __attribute__((no_sanitize_thread))

constexpr int kFrames = 4;         // the access's own address and the three innermost call sites
constexpr int kShadowDepth = 256;  // per fiber; deeper calls are not tracked (their sites lose callers)
constexpr int kMaxSpans = 64;
constexpr int kMaxGuards = 1024;  // a kernel file's __shared__ arrays of class type, over all its instantiations
enum Space { GLOBAL = 0, SHARED = 1 };

struct Key {
  uintptr_t frames[kFrames];
  unsigned char space, write;
  unsigned width;
};
struct Event {
  int site;  // index into State::sites
  unsigned calls[kFrames - 1];  // which call of each of the site's call sites this access belongs to
  uintptr_t address;
};
constexpr int kCallSlots = 1024;  // call sites a fiber may pass between two synchronisation points
struct CallCount {                // calls made from one call site since the last synchronisation point
  uintptr_t pc;
  unsigned round, count;
};
struct Log {  // one fiber's accesses since the last synchronisation point, and its shadow call stack
  Event* events = nullptr;
  size_t count = 0, capacity = 0;
  uintptr_t stack[kShadowDepth];
  unsigned call[kShadowDepth];  // stack[d]'s call number (CallCount::count when it was made)
  int depth = 0;
  CallCount calls[kCallSlots];  // open addressing on pc; entries of an earlier round count as empty
  unsigned round = 1;
};
struct Site {
  Key key;
  long long requests, lane_accesses, sectors, lines, useful_bytes, wavefronts;
  unsigned next[32];                   // per lane: executions of this site within its current calls
  unsigned last[32][kFrames - 1];      // per lane: those calls
};
struct Span {
  uintptr_t low, high, base;  // [low, high): the argument's bytes; base: its allocation's start
};
struct State {
  bool on = false;
  Span spans[kMaxSpans];
  int span_count = 0;
  uintptr_t shared_low = 0, shared_high = 0;
  unsigned long long guards[2 * kMaxGuards];  // [offset, end) in the TLS block of g++'s thread_local init guards
  int guard_count = 0;
  Log logs[1024];
  Site* sites = nullptr;
  int site_count = 0, site_capacity = 0;
  int* table = nullptr;  // open addressing: site index + 1, 0 empty
  int table_size = 0;
  long long blocks = 0;
};
static State state;

EMU_UNINSTRUMENTED static bool same_key(const Key& a, const Key& b) {
  for (int i = 0; i < kFrames; ++i)
    if (a.frames[i] != b.frames[i]) return false;
  return a.space == b.space && a.write == b.write && a.width == b.width;
}

EMU_UNINSTRUMENTED static size_t hash_key(const Key& k) {
  size_t h = k.space * 31u + k.write * 7u + k.width;
  for (int i = 0; i < kFrames; ++i) h = (h ^ k.frames[i]) * 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

EMU_UNINSTRUMENTED static void rehash(int size) {
  free(state.table);
  state.table = (int*)calloc(size, sizeof(int));
  if (!state.table) abort();
  state.table_size = size;
  for (int i = 0; i < state.site_count; ++i) {
    size_t slot = hash_key(state.sites[i].key) & (size - 1);
    while (state.table[slot]) slot = (slot + 1) & (size - 1);
    state.table[slot] = i + 1;
  }
}

EMU_UNINSTRUMENTED static int site_index(const Key& key) {
  if (2 * (state.site_count + 1) > state.table_size) rehash(state.table_size ? 2 * state.table_size : 1024);
  size_t slot = hash_key(key) & (state.table_size - 1);
  while (state.table[slot]) {
    const int i = state.table[slot] - 1;
    if (same_key(state.sites[i].key, key)) return i;
    slot = (slot + 1) & (state.table_size - 1);
  }
  if (state.site_count == state.site_capacity) {
    state.site_capacity = state.site_capacity ? 2 * state.site_capacity : 256;
    state.sites = (Site*)realloc(state.sites, state.site_capacity * sizeof(Site));
    if (!state.sites) abort();
  }
  Site* s = &state.sites[state.site_count];
  std::memset(s, 0, sizeof *s);
  s->key = key;
  state.table[slot] = ++state.site_count;
  return state.site_count - 1;
}

EMU_UNINSTRUMENTED static void record(uintptr_t pc, uintptr_t address, unsigned width, bool write) {
  if (!state.on || !engine.current) return;
  unsigned char space;
  if (address >= state.shared_low && address < state.shared_high) {
    const uintptr_t offset = address - state.shared_low;
    for (int g = 0; g < state.guard_count; ++g)
      if (offset >= state.guards[2 * g] && offset < state.guards[2 * g + 1]) return;  // not shared memory
    space = SHARED;
  } else {
    int i = 0;
    while (i < state.span_count && !(address >= state.spans[i].low && address < state.spans[i].high)) ++i;
    if (i == state.span_count) return;  // the fiber's stack (locals) or the engine's data
    space = GLOBAL;
    // Addresses counted from the allocation's start (256-byte aligned on a GPU), arguments 2^44 bytes apart.
    address = ((uintptr_t)(i + 1) << 44) + (address - state.spans[i].base);
  }
  Log& log = state.logs[engine.current - engine.fibers];
  Key key;
  Event event;
  key.frames[0] = pc;
  for (int f = 1; f < kFrames; ++f) {
    const int d = log.depth - f;
    key.frames[f] = d >= 0 && d < kShadowDepth ? log.stack[d] : 0;
    event.calls[f - 1] = d >= 0 && d < kShadowDepth ? log.call[d] : 0;
  }
  key.space = space;
  key.write = write;
  key.width = width;
  if (log.count == log.capacity) {
    log.capacity = log.capacity ? 2 * log.capacity : 1024;
    log.events = (Event*)realloc(log.events, log.capacity * sizeof(Event));
    if (!log.events) abort();
  }
  event.site = site_index(key);
  event.address = address;
  log.events[log.count++] = event;
}

// Numbers the calls made from each call site since the last synchronisation point: a lane whose helper skips
// its access (a load predicated off in the padding) still makes the call, so its next access pairs with the
// other lanes' accesses of the same call, as a predicated instruction does on a GPU.
EMU_UNINSTRUMENTED static unsigned count_call(Log& log, uintptr_t caller) {
  size_t slot = (caller * 0x9e3779b97f4a7c15ull >> 40) & (kCallSlots - 1);
  for (int probe = 0; probe < kCallSlots; ++probe, slot = (slot + 1) & (kCallSlots - 1)) {
    CallCount& c = log.calls[slot];
    if (c.round != log.round) {
      c = CallCount{caller, log.round, 1};
      return 1;
    }
    if (c.pc == caller) return ++c.count;
  }
  return 0;  // more call sites than slots: this call goes unnumbered
}

EMU_UNINSTRUMENTED static void push_frame(uintptr_t caller) {
  if (!engine.current || !state.on) return;
  Log& log = state.logs[engine.current - engine.fibers];
  if (log.depth < kShadowDepth) {
    log.stack[log.depth] = caller;
    log.call[log.depth] = count_call(log, caller);
  }
  ++log.depth;
}

EMU_UNINSTRUMENTED static void pop_frame() {
  if (!engine.current || !state.on) return;
  Log& log = state.logs[engine.current - engine.fibers];
  if (log.depth > 0) --log.depth;
}

// ---------------------------------------------------------------------------------------------------------
// Merging a warp's logs into requests.

struct LaneAccess {
  int site;
  unsigned calls[kFrames - 1];  // Event::calls
  unsigned k;  // the lane's k-th execution of the site within those calls
  int lane;
  uintptr_t address;
};

EMU_UNINSTRUMENTED static int by_request(const void* a, const void* b) {
  const LaneAccess* x = (const LaneAccess*)a;
  const LaneAccess* y = (const LaneAccess*)b;
  if (x->site != y->site) return x->site < y->site ? -1 : 1;
  for (int f = 0; f < kFrames - 1; ++f)
    if (x->calls[f] != y->calls[f]) return x->calls[f] < y->calls[f] ? -1 : 1;
  if (x->k != y->k) return x->k < y->k ? -1 : 1;
  return x->lane - y->lane;
}

EMU_UNINSTRUMENTED static int by_value(const void* a, const void* b) {
  const uintptr_t x = *(const uintptr_t*)a, y = *(const uintptr_t*)b;
  return x < y ? -1 : (x > y);
}

// Distinct values of v[0..n) (sorted in place).
EMU_UNINSTRUMENTED static long long distinct(uintptr_t* v, size_t n) {
  qsort(v, n, sizeof *v, by_value);
  long long count = 0;
  for (size_t i = 0; i < n; ++i) count += i == 0 || v[i] != v[i - 1];
  return count;
}

// Distinct units of 2^shift bytes touched by the accesses [a, a + width) of r[0..n).
EMU_UNINSTRUMENTED static long long distinct_units(const LaneAccess* r, size_t n, unsigned width, int shift,
                                                   uintptr_t* scratch) {
  size_t m = 0;
  for (size_t i = 0; i < n; ++i)
    for (uintptr_t u = r[i].address >> shift; u <= (r[i].address + width - 1) >> shift; ++u) scratch[m++] = u;
  return distinct(scratch, m);
}

// Bytes covered by the union of the accesses (what the request asks for, each byte once).
EMU_UNINSTRUMENTED static long long useful_bytes(const LaneAccess* r, size_t n, unsigned width,
                                                 uintptr_t* scratch) {
  for (size_t i = 0; i < n; ++i) scratch[i] = r[i].address;
  qsort(scratch, n, sizeof *scratch, by_value);
  long long bytes = 0;
  uintptr_t covered = 0;  // one past the last byte counted so far
  for (size_t i = 0; i < n; ++i) {
    const uintptr_t begin = i > 0 && scratch[i] < covered ? covered : scratch[i], end = scratch[i] + width;
    if (end > begin) bytes += end - begin;
    if (end > covered) covered = end;
  }
  return bytes;
}

// Shared memory wavefronts of one request: the lanes in phases (the whole warp for accesses of up to 4 bytes, half
// warps for 8 bytes, quarter warps for 16), each phase taking as many wavefronts as the largest number of
// distinct 4-byte words any one of the 32 banks holds among the words its lanes touch.
EMU_UNINSTRUMENTED static long long wavefronts(const LaneAccess* r, size_t n, unsigned width, uintptr_t* scratch) {
  const int phase_lanes = width == 8 ? 16 : width == 16 ? 8 : 32;
  long long total = 0;
  size_t i = 0;
  while (i < n) {
    const int phase = r[i].lane / phase_lanes;
    size_t m = 0;
    for (; i < n && r[i].lane / phase_lanes == phase; ++i)
      for (uintptr_t w = r[i].address >> 2; w <= (r[i].address + width - 1) >> 2; ++w)
        scratch[m++] = (w & 31) << 58 | (w >> 5);  // sorted by bank, then by word
    qsort(scratch, m, sizeof *scratch, by_value);
    long long worst = 0, in_bank = 0;
    for (size_t j = 0; j < m; ++j) {
      if (j > 0 && scratch[j] == scratch[j - 1]) continue;  // the same word: one read serves every lane
      in_bank = j > 0 && scratch[j] >> 58 == scratch[j - 1] >> 58 ? in_bank + 1 : 1;
      if (in_bank > worst) worst = in_bank;
    }
    total += worst;
  }
  return total;
}

EMU_UNINSTRUMENTED static void merge_warp(int base, int lanes) {
  size_t total = 0;
  for (int l = 0; l < lanes; ++l) total += state.logs[base + l].count;
  if (total == 0) return;
  LaneAccess* all = (LaneAccess*)malloc(total * sizeof(LaneAccess));
  if (!all) abort();
  size_t n = 0;
  for (int l = 0; l < lanes; ++l) {
    Log& log = state.logs[base + l];
    for (size_t e = 0; e < log.count; ++e) {
      const Event& event = log.events[e];
      Site& site = state.sites[event.site];
      if (std::memcmp(site.last[l], event.calls, sizeof event.calls) != 0) {  // a new call: count from 0
        std::memcpy(site.last[l], event.calls, sizeof event.calls);
        site.next[l] = 0;
      }
      LaneAccess a;
      a.site = event.site;
      std::memcpy(a.calls, event.calls, sizeof a.calls);
      a.k = site.next[l]++;
      a.lane = l;
      a.address = event.address;
      all[n++] = a;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    Site& site = state.sites[all[i].site];
    std::memset(site.next, 0, sizeof site.next);
    std::memset(site.last, 0, sizeof site.last);
  }
  qsort(all, n, sizeof *all, by_request);
  static uintptr_t* scratch = nullptr;  // per lane access: the words (or sectors, lines) it touches
  static size_t scratch_size = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && all[j].site == all[i].site && all[j].k == all[i].k &&
           std::memcmp(all[j].calls, all[i].calls, sizeof all[i].calls) == 0)
      ++j;
    Site& site = state.sites[all[i].site];
    const unsigned width = site.key.width ? site.key.width : 1;
    const size_t need = (j - i) * (width / 4 + 2);
    if (need > scratch_size) {
      scratch_size = 2 * need;
      scratch = (uintptr_t*)realloc(scratch, scratch_size * sizeof *scratch);
      if (!scratch) abort();
    }
    site.requests += 1;
    site.lane_accesses += j - i;
    site.useful_bytes += useful_bytes(all + i, j - i, width, scratch);
    if (site.key.space == GLOBAL) {
      site.sectors += distinct_units(all + i, j - i, width, 5, scratch);
      site.lines += distinct_units(all + i, j - i, width, 7, scratch);
    } else {
      site.wavefronts += wavefronts(all + i, j - i, width, scratch);
    }
    i = j;
  }
  free(all);
  for (int l = 0; l < lanes; ++l) {
    state.logs[base + l].count = 0;
    ++state.logs[base + l].round;  // call numbers start again
  }
}

// Engine hooks (emu_runtime.h).
EMU_UNINSTRUMENTED static void start_block(int n) {
  for (int i = 0; i < n; ++i) {
    state.logs[i].count = 0;
    state.logs[i].depth = 0;
    ++state.logs[i].round;
  }
}
// After a pass of the scheduler: every fiber waits at a barrier or a warp operation, or has exited.
EMU_UNINSTRUMENTED static void synchronised(int n) {
  if (!state.on) return;
  for (int base = 0; base < n; base += 32) merge_warp(base, n - base < 32 ? n - base : 32);
}
EMU_UNINSTRUMENTED static void end_block(bool ok) {
  if (state.on && ok) ++state.blocks;
}
EMU_UNINSTRUMENTED static void set_shared(const void* begin, const void* end) {
  state.shared_low = (uintptr_t)begin;
  state.shared_high = (uintptr_t)end;
}

#else  // not the profile build: the engine's hooks do nothing
static inline void record(uintptr_t, uintptr_t, unsigned, bool) {}
static inline void start_block(int) {}
static inline void synchronised(int) {}
static inline void end_block(bool) {}
static inline void set_shared(const void*, const void*) {}
#endif

}  // namespace counters
}  // namespace emu

#ifdef EMU_PROFILE
extern "C" {
// Start counting (and forget earlier counts): spans[3 i .. 3 i + 2] = low, high (one past the last byte) and
// allocation start of pointer argument i; guards[2 j], guards[2 j + 1]: offset and size in the TLS block of an
// initialisation guard (_build.tls_guards), whose accesses are not shared memory.
EMU_UNINSTRUMENTED void emu_profile_begin(const unsigned long long* spans, int count,
                                          const unsigned long long* guards, int guard_count) {
  using namespace emu::counters;
  state.on = true;
  state.guard_count = guard_count < kMaxGuards ? guard_count : kMaxGuards;
  for (int g = 0; g < state.guard_count; ++g) {
    state.guards[2 * g] = guards[2 * g];
    state.guards[2 * g + 1] = guards[2 * g] + guards[2 * g + 1];
  }
  state.span_count = count < kMaxSpans ? count : kMaxSpans;
  for (int i = 0; i < state.span_count; ++i)
    state.spans[i] = Span{(uintptr_t)spans[3 * i], (uintptr_t)spans[3 * i + 1], (uintptr_t)spans[3 * i + 2]};
  state.site_count = 0;
  if (state.table) std::memset(state.table, 0, state.table_size * sizeof(int));
  state.blocks = 0;
}
EMU_UNINSTRUMENTED void emu_profile_end() { emu::counters::state.on = false; }
EMU_UNINSTRUMENTED long long emu_profile_blocks() { return emu::counters::state.blocks; }
EMU_UNINSTRUMENTED int emu_profile_site_count() { return emu::counters::state.site_count; }
// Site i: frames (as offsets in this library, for addr2line) then space, write, width, requests, lane_accesses,
// sectors, lines, useful_bytes, wavefronts.
EMU_UNINSTRUMENTED void emu_profile_site(int i, long long* out) {
  const emu::counters::Site& s = emu::counters::state.sites[i];
  for (int f = 0; f < emu::counters::kFrames; ++f) {
    Dl_info info;
    const uintptr_t pc = s.key.frames[f];
    out[f] = pc && dladdr((void*)pc, &info) ? (long long)(pc - (uintptr_t)info.dli_fbase) : -1;
  }
  long long* v = out + emu::counters::kFrames;
  v[0] = s.key.space; v[1] = s.key.write; v[2] = s.key.width;
  v[3] = s.requests; v[4] = s.lane_accesses; v[5] = s.sectors; v[6] = s.lines; v[7] = s.useful_bytes;
  v[8] = s.wavefronts;
}
}
#endif  // EMU_PROFILE
