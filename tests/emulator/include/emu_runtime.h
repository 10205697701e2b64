// The emulator's execution engine, included by each generated launcher file after the kernel source.
//
// Blocks run one after another.  The threads of a block are fibers (own stacks) on the calling OS thread, switched
// only at __syncthreads() and warp operations, in a fixed order (forward or reverse): runs are deterministic,
// and a kernel that lacks a barrier reads another thread's data too early (or poison) in one of the orders.
// After every pass over the runnable fibers the scheduler releases whatever can go on (complete warp groups,
// then a barrier that every thread of the block reached at the same call) and reports anything else as a
// divergent barrier or a deadlock.  What the engine detects (those, undefined behaviour caught by the
// sanitizer checks) comes back to Python as a message, not as a crash.
#pragma once
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_mma.h"
#include "emu_async_copy.h"
#include "emu_wgmma_call.h"

// Defined in the second translation unit (dyn_shared.cpp), with every `extern __shared__` name aliased to it.
extern thread_local unsigned char emu_dynamic_shared[];

namespace emu {

constexpr size_t kStackBytes = 128 * 1024;  // per fiber; small so that 1024 fibers stay cheap (also under ASan)
constexpr size_t kGuardBytes = 4096;        // PROT_NONE page below each stack: an overflow faults at once
constexpr size_t kDynamicSharedCapacity = EMU_DYNAMIC_SHARED_CAPACITY;

enum State { RUNNABLE, AT_BARRIER, AT_WARP, DONE, FAILED };

// Fiber switching.  swapcontext makes two system calls a switch (it saves and restores the signal mask, which the
// engine never changes), most of the time of a kernel whose threads meet at many barriers and warp operations.
// So on x86-64 a switch is emu_switch_stack below: it saves what a called function must preserve (the
// callee-saved registers, the SSE and x87 control words) on the old stack, swaps the stack pointers and restores
// them from the new one.  In the ASan build as well: its fiber support is the __sanitizer_*_switch_fiber calls
// around each switch (swapcontext's interceptor did nothing more, as no fiber context records its stack).
// Elsewhere than x86-64, swapcontext.
#if defined(__x86_64__)
#define EMU_STACK_SWITCH 1
// emu_switch_stack(&saved, next): *saved = this stack's pointer, then resume the stack that `next` points into.
extern "C" void emu_switch_stack(void** saved, void* next);
asm(R"(
  .text
  .globl emu_switch_stack
  .hidden emu_switch_stack
  .type emu_switch_stack, @function
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");
#else
#define EMU_STACK_SWITCH 0
#endif

struct Fiber {
  ucontext_t context;  // swapcontext's (EMU_STACK_SWITCH 0)
  void* sp;            // emu_switch_stack's (EMU_STACK_SWITCH 1)
  char* stack;
  bool has_context;
  uint3 tid;
  int lane;
  int state;
  const char* file;  // where the fiber waits
  int line;
  int kind;  // warp operation: WARP_SYNC, WARP_SHFL, WARP_BALLOT, WARP_MMA, WARP_GROUP (a wgmma call)
  unsigned mask;
  int src_lane;
  unsigned long long value;
  unsigned long long* result;
  void* fake_stack;  // ASan's bookkeeping for this fiber's stack
  int barriers;      // __syncthreads() this thread has passed in its block
  int fenced_at;     // `barriers` at its last __threadfence(), -1 before the first
  int proxy_fenced_at;  // `barriers` at its last wgmma_fence_shared() (fence.proxy.async), -1 before the first
  long long proxy_seq, landed_seq;  // engine.events at its last proxy fence, at its last cp.async landing
};

struct Engine {
  Fiber* fibers = nullptr;
  int capacity = 0;  // fibers with a stack
  Fiber* current = nullptr;
  ucontext_t scheduler;
  void* scheduler_sp = nullptr;
  void (*body)(void*) = nullptr;  // runs the kernel in the current fiber
  void* closure = nullptr;
  bool reverse = false;
  const unsigned long long* only_blocks = nullptr;  // emu_set_blocks: run these blocks (linear indices) only
  long long only_count = -1;                         // -1: every block of the grid
  const void* scheduler_stack = nullptr;  // reported by ASan when a fiber starts
  size_t scheduler_stack_bytes = 0;
  const unsigned char* shared_begin = nullptr;  // the running grid's shared memory, [begin, end)
  const unsigned char* shared_end = nullptr;
  // The dynamic buffer's bytes past the launch's size: [dynamic_end, dynamic_capacity_end) (shared_access)
  const unsigned char* dynamic_end = nullptr;
  const unsigned char* dynamic_capacity_end = nullptr;
  long long events = 0;  // orders proxy fences and cp.async landings
  char message[4096];
};
static Engine engine;

}  // namespace emu
#include "emu_counters.h"  // the profile build's memory counters (no-ops in the other builds)
namespace emu {

// The scheduler's hot functions, which touch no memory of a kernel, are left out of the plain build's
// instrumentation (the hooks at the end of this file): tests/test_patch_igemm.py took 15.6 CPU s in its process with
// them instrumented, 12.5-13.4 without (9-11 before the hooks).  The
// profile build keeps them instrumented, so that its shadow call stacks stay as they were.
#if defined(__SANITIZE_THREAD__) && !defined(EMU_PROFILE)
#define EMU_ENGINE __attribute__((no_sanitize_thread))
#else
#define EMU_ENGINE
#endif

static void fail(const char* format, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(engine.message, sizeof engine.message, format, args);
  va_end(args);
}

static const char* where(const Fiber* f, char* text, size_t size) {
  switch (f->state) {
    case DONE: snprintf(text, size, "has exited"); break;
    case AT_BARRIER: snprintf(text, size, "waits at __syncthreads() at %s:%d", f->file, f->line); break;
    case AT_WARP: snprintf(text, size, "waits at a warp operation (mask 0x%08x) at %s:%d", f->mask, f->file, f->line); break;
    default: snprintf(text, size, "is runnable"); break;
  }
  return text;
}

#define EMU_THREAD(f) (f)->tid.x, (f)->tid.y, (f)->tid.z

// ---------------------------------------------------------------------------------------------------------
// Fiber switching (see EMU_STACK_SWITCH).  The sanitizer hooks tell ASan which stack is live, or it reports false
// stack errors.

EMU_ENGINE static void yield_to_scheduler(bool finished) {
  Fiber* f = engine.current;
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_start_switch_fiber(finished ? nullptr : &f->fake_stack, engine.scheduler_stack,
                                 engine.scheduler_stack_bytes);
#else
  (void)finished;
#endif
#if EMU_STACK_SWITCH
  emu_switch_stack(&f->sp, engine.scheduler_sp);
#else
  swapcontext(&f->context, &engine.scheduler);
#endif
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_finish_switch_fiber(f->fake_stack, &engine.scheduler_stack, &engine.scheduler_stack_bytes);
#endif
}

static void fiber_main() {
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_finish_switch_fiber(nullptr, &engine.scheduler_stack, &engine.scheduler_stack_bytes);
#endif
  engine.body(engine.closure);
  engine.current->state = DONE;
  yield_to_scheduler(true);
  abort();  // a finished fiber is never resumed
}

EMU_ENGINE static void resume(Fiber* f) {
  engine.current = f;
  threadIdx = f->tid;
#ifdef __SANITIZE_ADDRESS__
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, f->stack, kStackBytes);
#endif
#if EMU_STACK_SWITCH
  emu_switch_stack(&engine.scheduler_sp, f->sp);
#else
  swapcontext(&engine.scheduler, &f->context);
#endif
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  engine.current = nullptr;
}

static bool reserve_fibers(int n) {
  // Allocated once for the largest block: a ucontext_t points into itself (its saved FP state), so the array
  // must never move.  Stacks are mapped as blocks need them and kept for later launches.
  if (!engine.fibers) engine.fibers = (Fiber*)calloc(1024, sizeof(Fiber));
  if (!engine.fibers || n > 1024) return false;
  for (int i = engine.capacity; i < n; ++i) {
    void* base = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (base == MAP_FAILED) return false;
    mprotect(base, kGuardBytes, PROT_NONE);  // stacks grow down into the guard page
    engine.fibers[i].stack = (char*)base + kGuardBytes;
    engine.capacity = i + 1;
  }
  return true;
}

static void start_fiber(Fiber* f) {
#if EMU_STACK_SWITCH
  // What emu_switch_stack pops, at the top of the fiber's stack: the control words (the scheduler's), six
  // callee-saved registers (zeros) and the return address, fiber_main, entered with the stack pointer 8 below
  // a 16-byte boundary as after a call.
  void** sp = (void**)(f->stack + kStackBytes) - 2;
  sp[0] = (void*)&fiber_main;
  sp[1] = nullptr;
  sp -= 7;
  std::memset(sp, 0, 7 * sizeof(void*));
  unsigned mxcsr = 0;
  unsigned short x87 = 0;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(x87));
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy((char*)sp + 4, &x87, 2);
  f->sp = sp;
#else
  if (!f->has_context) {  // getcontext costs a system call: once per fiber, then makecontext reuses it
    getcontext(&f->context);
    f->has_context = true;
  }
  f->context.uc_stack.ss_sp = f->stack;
  f->context.uc_stack.ss_size = kStackBytes;
  f->context.uc_link = nullptr;
  makecontext(&f->context, fiber_main, 0);
  // Without a recorded stack, ASan's swapcontext interceptor does not clear this stack's shadow on every
  // switch (slow, and it would erase the redzones of the fiber's live frames).
  f->context.uc_stack.ss_sp = nullptr;
  f->context.uc_stack.ss_size = 0;
#endif
  f->state = RUNNABLE;
  f->barriers = 0;
  f->fenced_at = -1;
  f->proxy_fenced_at = -1;
  f->proxy_seq = f->landed_seq = 0;
}

// ---------------------------------------------------------------------------------------------------------
// Undefined behaviour.  Every build has -fsanitize=bounds,signed-integer-overflow,alignment, whose checks call
// the handlers below (the emulator's own, bound inside the library, in place of libubsan's, which would print
// and run on): they stop the faulty thread and fail the launch with the place and the values, so an index past
// a fixed-size array (a static __shared__ tile, a local array), an int index that overflows, or an access
// through a pointer not aligned to its type (a float4 or a pair of halves read as one unsigned: x86 does it,
// a GPU faults with "misaligned address") fails the test.

struct UbsanLocation { const char* file; unsigned line, column; };
struct UbsanType { unsigned short kind, info; char name[1]; };
struct UbsanOutOfBounds { UbsanLocation location; const UbsanType* array_type; const UbsanType* index_type; };
struct UbsanOverflow { UbsanLocation location; const UbsanType* type; };
struct UbsanTypeMismatch { UbsanLocation location; const UbsanType* type; unsigned char log_alignment, kind; };

static long long ubsan_integer(const UbsanType* type, uintptr_t value) {
  const unsigned bits = 1u << (type->info >> 1);  // integers of up to 64 bits are passed by value
  if (!(type->info & 1) || bits >= 64) return (long long)value;
  const unsigned long long sign = 1ull << (bits - 1);
  const unsigned long long v = value & ((sign << 1) - 1);
  return (long long)((v ^ sign) - sign);
}

static void undefined_behaviour(const UbsanLocation& at, const char* what) {
  char text[sizeof engine.message];
  if (engine.current)
    snprintf(text, sizeof text, "thread (%u,%u,%u): %s at %s:%u", EMU_THREAD(engine.current), what, at.file,
             at.line);
  else
    snprintf(text, sizeof text, "%s at %s:%u", what, at.file, at.line);
  std::memcpy(engine.message, text, sizeof text);
  if (!engine.current) return;
  engine.current->state = FAILED;
  yield_to_scheduler(false);  // never resumed: the block is abandoned
  abort();
}

// A rule of an emulated instruction broken (emu_async_copy.h): the same stop as undefined behaviour.
void thread_failure(const char* file, int line, const char* what) {
  undefined_behaviour(UbsanLocation{file, (unsigned)line, 0}, what);
}

static void overflow(UbsanOverflow* data, const char* op, uintptr_t lhs, uintptr_t rhs) {
  char what[512];
  snprintf(what, sizeof what, "signed integer overflow: %lld %s %lld in type %s", ubsan_integer(data->type, lhs),
           op, ubsan_integer(data->type, rhs), data->type->name);
  undefined_behaviour(data->location, what);
}

}  // namespace emu

#define EMU_UBSAN_HANDLER extern "C" __attribute__((visibility("hidden"))) void
EMU_UBSAN_HANDLER __ubsan_handle_out_of_bounds(emu::UbsanOutOfBounds* data, uintptr_t index) {
  char what[512];
  snprintf(what, sizeof what, "index %lld out of bounds for type %s", emu::ubsan_integer(data->index_type, index),
           data->array_type->name);
  emu::undefined_behaviour(data->location, what);
}
EMU_UBSAN_HANDLER __ubsan_handle_add_overflow(emu::UbsanOverflow* d, uintptr_t a, uintptr_t b) { emu::overflow(d, "+", a, b); }
EMU_UBSAN_HANDLER __ubsan_handle_sub_overflow(emu::UbsanOverflow* d, uintptr_t a, uintptr_t b) { emu::overflow(d, "-", a, b); }
EMU_UBSAN_HANDLER __ubsan_handle_mul_overflow(emu::UbsanOverflow* d, uintptr_t a, uintptr_t b) { emu::overflow(d, "*", a, b); }
EMU_UBSAN_HANDLER __ubsan_handle_negate_overflow(emu::UbsanOverflow* d, uintptr_t a) { emu::overflow(d, "0 -", 0, a); }
EMU_UBSAN_HANDLER __ubsan_handle_divrem_overflow(emu::UbsanOverflow* d, uintptr_t a, uintptr_t b) { emu::overflow(d, "/", a, b); }
// With alignment the only check of this family that is on, a call means a misaligned address.
EMU_UBSAN_HANDLER __ubsan_handle_type_mismatch_v1(emu::UbsanTypeMismatch* data, uintptr_t pointer) {
  static const char* const kinds[] = {"load of", "store to", "reference to", "member access in", "member call on"};
  char what[512];
  snprintf(what, sizeof what, "misaligned address 0x%llx for a %s type %s, which needs %u-byte alignment "
           "(a GPU faults: misaligned address)", (unsigned long long)pointer,
           data->kind < 5 ? kinds[data->kind] : "use of", data->type->name, 1u << data->log_alignment);
  emu::undefined_behaviour(data->location, what);
}

namespace emu {

// ---------------------------------------------------------------------------------------------------------
// Synchronisation points (called from kernel code, i.e. inside a fiber).

EMU_ENGINE void syncthreads(const char* file, int line) {
  Fiber* f = engine.current;
  f->state = AT_BARRIER;
  f->file = file;
  f->line = line;
  yield_to_scheduler(false);
  ++f->barriers;
}

// Memory fences and the atomics that publish a block's work (prelude.h).  On a GPU a thread's global stores
// reach another block in order with its later accesses only through the thread's own __threadfence(); a block
// that stores, fences, passes a barrier and then counts itself with an atomic (the last block of a split-K then
// reads everyone's sums) needs the fence in EVERY storing thread.  The emulator does not see plain stores, so
// it takes every thread of the block for a writer: an integer atomic on global memory made after a barrier
// fails unless each thread of the block fenced after the barrier before the atomic's (or later).  An atomic
// before any barrier (a ticket, a counter) publishes nothing and is not checked.
void threadfence() { engine.current->fenced_at = engine.current->barriers; }

void proxy_fence() {
  engine.current->proxy_fenced_at = engine.current->barriers;
  engine.current->proxy_seq = ++engine.events;
}

void copies_landed() { engine.current->landed_seq = ++engine.events; }

void publishing_atomic(const void* address, const char* file, int line) {
  const Fiber* f = engine.current;
  const unsigned char* p = (const unsigned char*)address;
  if (f->barriers == 0 || (p >= engine.shared_begin && p < engine.shared_end)) return;
  const int n = (int)(blockDim.x * blockDim.y * blockDim.z);
  for (int i = 0; i < n; ++i) {
    const Fiber* g = &engine.fibers[i];
    if (g->fenced_at < f->barriers - 1) {
      char what[320];
      snprintf(what, sizeof what, "atomic after a barrier, but thread (%u,%u,%u) did not __threadfence() since the "
               "barrier before it: its global stores may not be visible to the block that sees this count",
               EMU_THREAD(g));
      thread_failure(file, line, what);
    }
  }
}

EMU_ENGINE void warp_exchange(const char* file, int line, int kind, unsigned mask, unsigned long long value,
                              int src_lane, unsigned long long* result) {
  Fiber* f = engine.current;
  f->state = AT_WARP;
  f->file = file;
  f->line = line;
  f->kind = kind;
  f->mask = mask;
  f->value = value;
  f->src_lane = src_lane;
  f->result = result;
  yield_to_scheduler(false);
}

EMU_ENGINE int lane_id() { return engine.current->lane; }

void warp_mma(const char* file, int line, const MmaOperands* operands) {
  warp_exchange(file, line, WARP_MMA, 0xffffffffu, (unsigned long long)(uintptr_t)operands, lane_id(), nullptr);
}

void warpgroup_call(const char* file, int line, const WgmmaCall* call) {
  warp_exchange(file, line, WARP_GROUP, 0xffffffffu, (unsigned long long)(uintptr_t)call, lane_id(), nullptr);
}

// A tf32 operand's value as the tensor cores read its 32 bits (mma.sync and wgmma alike): sign, exponent and the
// top 10 mantissa bits, the 13 low bits ignored (a float not rounded to tf32 first is truncated).
static double tf32_operand(unsigned bits) {
  bits &= ~0x1fffu;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One mma.sync of the warp whose lane 0 is fiber `base`: A, B, C assembled from the 32 lanes' fragments in the
// documented layouts (raw_kernels/mma.cuh), D = A * B + C handed back.  Returns false after reporting a misuse.
EMU_ENGINE static bool mma_collective(int base, int n) {
  const Fiber* first = &engine.fibers[base];
  if (base + 32 > n) {
    fail("thread (%u,%u,%u) calls mma.sync at %s:%d in a warp of %d threads; it needs all 32 lanes",
         EMU_THREAD(first), first->file, first->line, n - base);
    return false;
  }
  const MmaOperands* op[32];
  for (int lane = 0; lane < 32; ++lane) {
    op[lane] = (const MmaOperands*)(uintptr_t)engine.fibers[base + lane].value;
    if (op[lane]->shape != op[0]->shape) {
      fail("mma.sync at %s:%d: lanes 0 and %d ask for different shapes or types", first->file, first->line, lane);
      return false;
    }
  }
  const int shape = op[0]->shape;
  auto half_value = [shape](unsigned bits) -> double {
    if (shape == MMA_M16N8K16_BF16) return (double)__ushort_as_bfloat16((unsigned short)bits);
    return (double)__ushort_as_half((unsigned short)bits);
  };
  double A[16][16] = {}, B[16][8] = {}, C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, q = lane & 3;
    const unsigned* a = op[lane]->a;
    const unsigned* b = op[lane]->b;
    if (shape == MMA_M16N8K8_TF32) {
      A[g][q] = tf32_operand(a[0]);
      A[g + 8][q] = tf32_operand(a[1]);
      A[g][q + 4] = tf32_operand(a[2]);
      A[g + 8][q + 4] = tf32_operand(a[3]);
      B[q][g] = tf32_operand(b[0]);
      B[q + 4][g] = tf32_operand(b[1]);
    } else {
      for (int r = 0; r < 4; ++r) {
        const int row = g + 8 * (r & 1), col = 2 * q + 8 * (r >> 1);
        A[row][col] = half_value(a[r] & 0xffffu);
        A[row][col + 1] = half_value(a[r] >> 16);
      }
      for (int r = 0; r < 2; ++r) {
        B[2 * q + 8 * r][g] = half_value(b[r] & 0xffffu);
        B[2 * q + 8 * r + 1][g] = half_value(b[r] >> 16);
      }
    }
    const float* d = op[lane]->d;
    C[g][2 * q] = d[0];
    C[g][2 * q + 1] = d[1];
    C[g + 8][2 * q] = d[2];
    C[g + 8][2 * q + 1] = d[3];
  }
  const int k_size = shape == MMA_M16N8K8_TF32 ? 8 : 16;
  float D[16][8];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      double sum = C[i][j];
      for (int k = 0; k < k_size; ++k) sum += A[i][k] * B[k][j];
      D[i][j] = (float)sum;
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, q = lane & 3;
    float* d = op[lane]->d;
    d[0] = D[g][2 * q];
    d[1] = D[g][2 * q + 1];
    d[2] = D[g + 8][2 * q];
    d[3] = D[g + 8][2 * q + 1];
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// wgmma (emu_wgmma.h): the warpgroup collectives, with all 128 threads' calls in hand.

constexpr int kWarpgroup = 128;
constexpr int kWgmmaInFlight = 16;              // per warpgroup: more fails the launch (an emulator limit)
constexpr int kWgmmaMaxRegs = 64;               // m64n128k16's accumulators a thread
constexpr int kWgmmaMaxChunks = 2 * (64 + 128); // 16-byte chunks of A (64 rows) and B (up to 128 rows)

struct WgmmaInFlight {
  long long group;
  int regs;
  const char* file;
  int line;
  float* d[kWarpgroup];
  float result[kWarpgroup][kWgmmaMaxRegs];
  int chunks;
  const unsigned char* chunk[kWgmmaMaxChunks];  // the shared bytes read, and their values then
  unsigned char bytes[kWgmmaMaxChunks][16];
};
struct WarpgroupState {
  bool fenced;
  long long open_group;
  int count;
  WgmmaInFlight ops[kWgmmaInFlight];  // in issue order
};
static WarpgroupState warpgroups[1024 / kWarpgroup];

static uintptr_t shared_window_base() { return (uintptr_t)engine.shared_begin & ~(uintptr_t)1023; }

unsigned shared_window_address(const void* p) { return (unsigned)((uintptr_t)p - shared_window_base()); }

static void wgmma_begin_block() {
  for (WarpgroupState& wg : warpgroups) {
    wg.fenced = false;
    wg.open_group = 0;
    wg.count = 0;
  }
}

// 0, or -1 with engine.message set when a warpgroup of the finished block left a wgmma in flight.
static int wgmma_end_block() {
  for (const WarpgroupState& wg : warpgroups) {
    if (wg.count) {
      fail("the block ended with the wgmma at %s:%d in flight: no wgmma.wait_group retired it (its accumulators "
           "are never written)", wg.ops[0].file, wg.ops[0].line);
      return -1;
    }
  }
  return 0;
}

// The host address of 16-byte chunk c (K elements 8 c .. 8 c + 7) of row r of the K-major tile that `desc`
// describes (emu_wgmma.h), or nullptr after reporting why it cannot be read.
static const unsigned char* wgmma_row_chunk(unsigned long long desc, int r, int c, const char* operand,
                                            const Fiber* first) {
  const unsigned start = (unsigned)(desc & 0x3FFFu) << 4;
  const unsigned leading = (unsigned)(desc >> 16 & 0x3FFFu) << 4;
  const unsigned stride = (unsigned)(desc >> 32 & 0x3FFFu) << 4;
  const int swizzle = (int)(desc >> 62);
  if (desc >> 49 & 7) {
    fail("wgmma at %s:%d: %s's descriptor has a matrix base offset, which the emulator does not model", first->file,
         first->line, operand);
    return nullptr;
  }
  unsigned address;
  if (swizzle == 0) {  // interleaved 8 x 16-byte core matrices: rows 16 bytes apart
    address = start + (unsigned)(r / 8) * stride + (unsigned)c * leading + (unsigned)(r % 8) * 16;
  } else {
    const unsigned width = swizzle == 1 ? 128 : swizzle == 2 ? 64 : 32;  // a row of the swizzle pattern
    if (start % (8 * width) >= width || stride % (8 * width)) {
      fail("wgmma at %s:%d: %s's %u-byte swizzle starts at shared byte %u with a stride of %u: an 8-row group "
           "must start on a %u-byte boundary (plus the K offset within its row)", first->file, first->line,
           operand, width, start, stride, 8 * width);
      return nullptr;
    }
    const unsigned logical = start + (unsigned)(r / 8) * stride + (unsigned)(r % 8) * width + 16u * (unsigned)c;
    address = logical ^ ((logical >> 7 & (width / 16 - 1)) << 4);
  }
  const uintptr_t host = shared_window_base() + address;
  if (address > 0x3FFFFu - 15 || host < (uintptr_t)engine.shared_begin || host + 16 > (uintptr_t)engine.shared_end) {
    fail("wgmma at %s:%d: row %d of %s is at shared byte %u, outside the block's shared memory", first->file,
         first->line, r, operand, address);
    return nullptr;
  }
  int owner;
  const void* at;
  if (const AsyncCopy* copy = async_copy_in_flight((const void*)host, 16, &owner, &at)) {
    fail("wgmma at %s:%d: row %d of %s is at %p, which a cp.async of thread %d (at %s:%d) still has in flight",
         first->file, first->line, r, operand, at, owner, copy->file, copy->line);
    return nullptr;
  }
  return (const unsigned char*)host;
}

// Elements of a wgmma k step (32 bytes of a row) of operand type `type` (WgmmaCall::type): 16, or 8 of tf32.
static int wgmma_k(int type) { return type == 2 ? 8 : 16; }

// Reads `rows` x wgmma_k(type) elements of a K-major operand into m (two 16-byte chunks a row), keeping the chunks
// read in op; false after a report.
static bool wgmma_read(unsigned long long desc, int rows, int type, const char* operand, const Fiber* first,
                       WgmmaInFlight* op, double (*m)[16]) {
  const int per_chunk = wgmma_k(type) / 2;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < 2; ++c) {
      const unsigned char* p = wgmma_row_chunk(desc, r, c, operand, first);
      if (!p) return false;
      op->chunk[op->chunks] = p;
      std::memcpy(op->bytes[op->chunks++], p, 16);
      for (int e = 0; e < per_chunk; ++e) {
        double& value = m[r][per_chunk * c + e];
        if (type == 2) {
          unsigned bits;
          std::memcpy(&bits, p + 4 * e, 4);
          value = tf32_operand(bits);
        } else {
          unsigned short bits;
          std::memcpy(&bits, p + 2 * e, 2);
          value = type == 1 ? (double)__ushort_as_bfloat16(bits) : (double)__ushort_as_half(bits);
        }
      }
    }
  }
  return true;
}

// The latest wgmma in flight that writes thread t's accumulators d, or nullptr.
static const WgmmaInFlight* wgmma_writer(const WarpgroupState& wg, int t, const float* d, int from = 0) {
  for (int k = wg.count - 1; k >= from; --k)
    if (wg.ops[k].d[t] == d) return &wg.ops[k];
  return nullptr;
}

static bool wgmma_issue(WarpgroupState& wg, const WgmmaCall* const* call, int base, int n) {
  const Fiber* first = &engine.fibers[base];
  const WgmmaCall& c0 = *call[0];
  for (int t = 1; t < kWarpgroup; ++t) {
    const WgmmaCall& c = *call[t];
    if (c.n != c0.n || c.type != c0.type || c.desc_a != c0.desc_a || c.desc_b != c0.desc_b ||
        c.accumulate != c0.accumulate) {
      fail("wgmma at %s:%d: thread (%u,%u,%u) gives other descriptors, shape or scale-d than thread (%u,%u,%u) of "
           "its warpgroup (.sync.aligned: they must agree)", first->file, first->line,
           EMU_THREAD(&engine.fibers[base + t]), EMU_THREAD(first));
      return false;
    }
  }
  if (!wg.fenced) {
    fail("wgmma at %s:%d: no wgmma.fence since the warpgroup's last wgmma.wait_group (or its start): the "
         "accumulator registers are not ordered with the wgmma", first->file, first->line);
    return false;
  }
  for (int j = 0; j < n; ++j) {
    const Fiber* g = &engine.fibers[j];
    if (g->proxy_fenced_at < 0 || g->proxy_fenced_at < first->barriers - 1) {
      fail("wgmma at %s:%d: thread (%u,%u,%u) did not wgmma_fence_shared() (fence.proxy.async) since the barrier "
           "before the last one: its shared stores may be invisible to the wgmma's operand reads", first->file,
           first->line, EMU_THREAD(g));
      return false;
    }
    if (g->proxy_seq < g->landed_seq) {
      fail("wgmma at %s:%d: cp.async copies of thread (%u,%u,%u) landed after its last wgmma_fence_shared() "
           "(fence.proxy.async orders only the writes before it): the wgmma may not see them", first->file,
           first->line, EMU_THREAD(g));
      return false;
    }
  }
  if (wg.count == kWgmmaInFlight) {
    fail("wgmma at %s:%d: more than %d wgmmas in flight in one warpgroup (the emulator's limit)", first->file,
         first->line, kWgmmaInFlight);
    return false;
  }
  WgmmaInFlight& op = wg.ops[wg.count];
  op.chunks = 0;
  static double A[64][16], B[128][16];
  if (!wgmma_read(c0.desc_a, 64, c0.type, "A", first, &op, A) ||
      !wgmma_read(c0.desc_b, c0.n, c0.type, "B", first, &op, B))
    return false;
  const int k_size = wgmma_k(c0.type);
  op.group = wg.open_group;
  op.regs = c0.n / 2;
  op.file = first->file;
  op.line = first->line;
  for (int t = 0; t < kWarpgroup; ++t) {
    float* d = call[t]->d;
    const WgmmaInFlight* earlier = wgmma_writer(wg, t, d);  // the same registers, still in flight: its D is C
    const int w = t / 32, g = t % 32 / 4, q = t % 4;
    for (int reg = 0; reg < op.regs; ++reg) {
      const int row = 16 * w + g + 8 * (reg >> 1 & 1), col = 8 * (reg / 4) + 2 * q + (reg & 1);
      double sum = !c0.accumulate ? 0.0 : earlier ? earlier->result[t][reg] : d[reg];
      for (int k = 0; k < k_size; ++k) sum += A[row][k] * B[col][k];
      op.result[t][reg] = (float)sum;
    }
    op.d[t] = d;
  }
  for (int t = 0; t < kWarpgroup; ++t) std::memset(call[t]->d, 0xFF, sizeof(float) * op.regs);  // until the wait
  ++wg.count;
  return true;
}

static bool wgmma_retire(WarpgroupState& wg, int wait, int base) {
  const long long below = wg.open_group - wait;  // committed groups older than the `wait` most recent
  int retiring = 0;
  while (retiring < wg.count && wg.ops[retiring].group < below) ++retiring;  // groups are in issue order
  for (int k = 0; k < retiring; ++k) {
    const WgmmaInFlight& op = wg.ops[k];
    for (int i = 0; i < op.chunks; ++i) {
      if (std::memcmp(op.chunk[i], op.bytes[i], 16)) {
        fail("wgmma at %s:%d: shared memory at %p that it reads changed before the wgmma.wait_group that retires "
             "it (the tensor cores may read it at any time until then)", op.file, op.line, op.chunk[i]);
        return false;
      }
    }
    for (int t = 0; t < kWarpgroup; ++t) {
      for (int reg = 0; reg < op.regs; ++reg) {
        unsigned bits;
        std::memcpy(&bits, &op.d[t][reg], 4);
        if (bits != 0xFFFFFFFFu) {
          fail("wgmma at %s:%d: thread (%u,%u,%u) wrote its accumulator %d while the wgmma was in flight", op.file,
               op.line, EMU_THREAD(&engine.fibers[base + t]), reg);
          return false;
        }
      }
    }
  }
  for (int k = 0; k < retiring; ++k) {  // then each thread's registers get the D of the last wgmma writing them,
    const WgmmaInFlight& op = wg.ops[k];  // unless that one is still in flight
    for (int t = 0; t < kWarpgroup; ++t)
      if (!wgmma_writer(wg, t, op.d[t], k + 1)) std::memcpy(op.d[t], op.result[t], sizeof(float) * op.regs);
  }
  for (int k = retiring; k < wg.count; ++k) wg.ops[k - retiring] = wg.ops[k];
  wg.count -= retiring;
  wg.fenced = false;
  return true;
}

// One wgmma call of the warpgroup whose first thread is fiber `base`.  Returns false after reporting a misuse.
EMU_ENGINE static bool wgmma_collective(int base, int n) {
  const Fiber* first = &engine.fibers[base];
  const WgmmaCall* call[kWarpgroup];
  for (int t = 0; t < kWarpgroup; ++t) call[t] = (const WgmmaCall*)(uintptr_t)engine.fibers[base + t].value;
  WarpgroupState& wg = warpgroups[base / kWarpgroup];
  switch (call[0]->op) {
    case WGMMA_FENCE: wg.fenced = true; return true;
    case WGMMA_COMMIT: ++wg.open_group; return true;
    case WGMMA_MMA: return wgmma_issue(wg, call, base, n);
    default:
      for (int t = 1; t < kWarpgroup; ++t) {
        if (call[t]->wait != call[0]->wait) {
          fail("wgmma.wait_group at %s:%d: threads of one warpgroup wait for different counts", first->file,
               first->line);
          return false;
        }
      }
      return wgmma_retire(wg, call[0]->wait, base);
  }
}

EMU_ENGINE static bool same_site(const Fiber* a, const Fiber* b) {
  return a->line == b->line && (a->file == b->file || std::strcmp(a->file, b->file) == 0);
}

// The group a warp operation of fiber i (f) synchronises: its warp's lanes named in the mask, or for a wgmma call
// (WARP_GROUP) all 128 threads of its aligned warpgroup.  base: the group's first fiber; member m: fiber base + m.
EMU_ENGINE static int group_base(int i, const Fiber* f) {
  return f->kind == WARP_GROUP ? i - i % kWarpgroup : i - f->lane;
}
EMU_ENGINE static int group_size(const Fiber* f) { return f->kind == WARP_GROUP ? kWarpgroup : 32; }
EMU_ENGINE static bool in_group(const Fiber* f, int m) { return f->kind == WARP_GROUP || (f->mask >> m & 1u); }
EMU_ENGINE static bool waits_with(const Fiber* f, const Fiber* g) {
  return g->state == AT_WARP && same_site(f, g) && g->mask == f->mask && g->kind == f->kind;
}

// Releases every warp group whose lanes (those named in the mask that exist in this block; for a wgmma call the
// 128 threads of the warpgroup) all wait at the same warp operation with the same mask.  Returns how many groups
// went on, or -1 after reporting a misuse.
EMU_ENGINE static int release_warps(int n) {
  int released = 0;
  for (int i = 0; i < n; ++i) {
    Fiber* f = &engine.fibers[i];
    if (f->state != AT_WARP) continue;
    const int base = group_base(i, f), size = group_size(f);
    if (!(f->mask >> f->lane & 1u)) {
      fail("thread (%u,%u,%u) calls a warp operation at %s:%d with mask 0x%08x, which does not include its own "
           "lane %d", EMU_THREAD(f), f->file, f->line, f->mask, f->lane);
      return -1;
    }
    if (base + size > n) {
      if (f->kind == WARP_GROUP) {
        fail("thread (%u,%u,%u) calls a wgmma operation at %s:%d in a warpgroup of %d threads; it needs all 128",
             EMU_THREAD(f), f->file, f->line, n - base);
        return -1;
      }
    }
    bool ready = true;
    for (int m = 0; m < size && base + m < n; ++m)
      if (in_group(f, m) && !waits_with(f, &engine.fibers[base + m])) ready = false;
    if (!ready) continue;
    if (f->kind == WARP_MMA && !mma_collective(base, n)) return -1;
    if (f->kind == WARP_GROUP && !wgmma_collective(base, n)) return -1;
    unsigned long long ballot = 0;
    for (int lane = 0; lane < 32 && base + lane < n && size == 32; ++lane) {
      const Fiber* g = &engine.fibers[base + lane];
      if ((f->mask >> lane & 1u) && g->value) ballot |= 1ull << lane;
    }
    for (int m = 0; m < size && base + m < n; ++m) {
      Fiber* g = &engine.fibers[base + m];
      if (!in_group(f, m)) continue;
      if (g->kind == WARP_SHFL) {
        const int src = g->src_lane;
        const bool valid = src >= 0 && src < 32 && base + src < n && (f->mask >> src & 1u);
        *g->result = valid ? engine.fibers[base + src].value : ~0ull;  // outside the group: poison bits
      } else if (g->kind == WARP_BALLOT) {
        *g->result = ballot;
      }
      g->state = RUNNABLE;
    }
    ++released;
  }
  return released;
}

// Runs the n fibers of the current block to completion; returns 0, or -1 with engine.message set.
EMU_ENGINE static int run_block(int n) {
  for (int i = 0; i < n; ++i) {
    Fiber* f = &engine.fibers[i];
    f->tid = uint3{i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y)};
    f->lane = i % 32;
    start_fiber(f);
  }
  counters::start_block(n);
  char a[256], b[256];
  for (;;) {
    for (int k = 0; k < n; ++k) {
      Fiber* f = &engine.fibers[engine.reverse ? n - 1 - k : k];
      if (f->state == RUNNABLE) resume(f);
      if (f->state == FAILED) return -1;  // undefined behaviour, engine.message says where
    }
    counters::synchronised(n);  // every fiber now waits or has exited: warp requests are complete
    const int released = release_warps(n);
    if (released < 0) return -1;
    if (released > 0) continue;
    // Nothing can run: the block is finished, or every live thread waits at one __syncthreads(), or it is stuck.
    const Fiber* exited = nullptr;
    const Fiber* barrier = nullptr;
    const Fiber* warp = nullptr;
    int done = 0;
    for (int i = 0; i < n; ++i) {
      const Fiber* f = &engine.fibers[i];
      if (f->state == DONE) { ++done; if (!exited) exited = f; }
      if (f->state == AT_BARRIER && !barrier) barrier = f;
      if (f->state == AT_WARP && !warp) warp = f;
    }
    if (done == n) return wgmma_end_block();
    if (warp) {
      const Fiber* other = warp;  // a member of warp's group that is somewhere else
      const int base = group_base((int)(warp - engine.fibers), warp), size = group_size(warp);
      for (int m = 0; m < size && base + m < n && other == warp; ++m)
        if (in_group(warp, m) && !waits_with(warp, &engine.fibers[base + m])) other = &engine.fibers[base + m];
      fail("deadlock: thread (%u,%u,%u) %s, but thread (%u,%u,%u) of its %s %s", EMU_THREAD(warp),
           where(warp, a, sizeof a), EMU_THREAD(other), size == 32 ? "warp" : "warpgroup", where(other, b, sizeof b));
      return -1;
    }
    if (exited) {
      fail("divergent barrier: thread (%u,%u,%u) %s, but thread (%u,%u,%u) has exited (every thread of a block "
           "must reach each __syncthreads(), or none)", EMU_THREAD(barrier), where(barrier, a, sizeof a),
           EMU_THREAD(exited));
      return -1;
    }
    for (int i = 0; i < n; ++i) {
      const Fiber* f = &engine.fibers[i];
      if (!same_site(f, barrier)) {
        fail("divergent barrier: thread (%u,%u,%u) %s, but thread (%u,%u,%u) %s", EMU_THREAD(barrier),
             where(barrier, a, sizeof a), EMU_THREAD(f), where(f, b, sizeof b));
        return -1;
      }
    }
    for (int i = 0; i < n; ++i) engine.fibers[i].state = RUNNABLE;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Shared memory: this library's whole TLS block (see __shared__ in prelude.h).

struct TlsSearch { const void* code; unsigned char* begin; size_t size; };

static int find_tls(struct dl_phdr_info* info, size_t, void* data) {
  TlsSearch* search = (TlsSearch*)data;
  bool ours = false;
  const ElfW(Phdr)* tls = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && (uintptr_t)search->code >= start && (uintptr_t)search->code < start + ph.p_memsz)
      ours = true;
    if (ph.p_type == PT_TLS) tls = &ph;
  }
  if (!ours) return 0;
  if (tls && info->dlpi_tls_data) {
    search->begin = (unsigned char*)info->dlpi_tls_data;
    search->size = tls->p_memsz;
  }
  return 1;
}

struct SharedMemory {
  unsigned char* begin;  // the TLS block: static __shared__ variables and the dynamic buffer
  unsigned char* end;
  unsigned char* dynamic;
};

static SharedMemory locate_shared() {
  SharedMemory s;
  s.dynamic = emu_dynamic_shared;  // also makes sure this thread's TLS block exists
  TlsSearch search = {(const void*)&locate_shared, nullptr, 0};
  dl_iterate_phdr(find_tls, &search);
  s.begin = search.begin ? search.begin : s.dynamic;
  s.end = search.begin ? search.begin + search.size : s.dynamic + kDynamicSharedCapacity;
  return s;
}

// 0xFF everywhere a block may look (NaN for every float type), so reads of unwritten shared memory poison.
static void poison_shared(const SharedMemory& s, size_t dynamic_bytes) {
  const unsigned char* dynamic_end = s.dynamic + kDynamicSharedCapacity;
  if (s.dynamic >= s.begin && dynamic_end <= s.end) {
    std::memset(s.begin, 0xFF, s.dynamic - s.begin);
    std::memset(s.dynamic + kDynamicSharedCapacity, 0xFF, s.end - dynamic_end);
    std::memset(s.dynamic, 0xFF, dynamic_bytes);
  } else {
    std::memset(s.begin, 0xFF, s.end - s.begin);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Under ASan, pointer arguments are replaced by malloc'd copies of exactly the bytes the array spans (NumPy's
// own buffers may be views into larger ones), so any access outside an argument hits a redzone.  A copy keeps
// the original's address modulo 16, the widest vector access, so that a misaligned view stays misaligned (and
// an aligned one aligned); the bytes in front of it are poisoned, whole 8-byte granules only (ASan's shadow
// cannot mark the first bytes of a granule bad and the rest good).

constexpr size_t kArgumentAlignment = 16;

struct ArgumentCopy {
  char* low;   // the original span
  size_t bytes;
  char* copy;
  void* block;  // what posix_memalign returned: copy minus the padding
  bool write_back;
};

static void copy_arguments(int n, const bool* is_pointer, const bool* is_const, void** args,
                           const long long* extents, void** values, void** slots, ArgumentCopy* copies) {
  for (int i = 0; i < n; ++i) {
    copies[i].copy = nullptr;
    if (!is_pointer[i]) continue;
    char* data = *(char**)args[i];
    char* low = data + extents[2 * i];
    const size_t bytes = (size_t)(extents[2 * i + 1] - extents[2 * i]);
    ArgumentCopy* same = nullptr;  // the same span passed twice stays one buffer
    for (int j = 0; j < i; ++j)
      if (copies[j].copy && copies[j].low == low && copies[j].bytes == bytes) same = &copies[j];
    char* copy;
    if (same) {
      copy = same->copy;
      same->write_back |= !is_const[i];
    } else {
      const size_t pad = (uintptr_t)low % kArgumentAlignment;
      void* block = nullptr;
      if (posix_memalign(&block, kArgumentAlignment, pad + (bytes ? bytes : 1)) != 0) abort();
      copy = (char*)block + pad;
      if (bytes) std::memcpy(copy, low, bytes);
#ifdef __SANITIZE_ADDRESS__
      __asan_poison_memory_region(block, pad);
      if (!bytes) __asan_poison_memory_region(copy, 1);  // an empty array has no byte to touch
#endif
      copies[i] = ArgumentCopy{low, bytes, copy, block, !is_const[i]};
    }
    values[i] = copy + (data - low);
    slots[i] = &values[i];
  }
}

static void release_arguments(int n, ArgumentCopy* copies, bool write_back) {
  for (int i = 0; i < n; ++i) {
    if (!copies[i].copy) continue;
    if (write_back && copies[i].write_back && copies[i].bytes) std::memcpy(copies[i].low, copies[i].copy, copies[i].bytes);
#ifdef __SANITIZE_ADDRESS__
    __asan_unpoison_memory_region(copies[i].block, copies[i].copy + 1 - (char*)copies[i].block);
#endif
    free(copies[i].block);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The grid.

static int run_grid(const unsigned* grid, const unsigned* block, unsigned long long dynamic_bytes,
                    void (*body)(void*), void* closure) {
  const unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
  if (threads < 1 || threads > 1024 || block[0] > 1024 || block[1] > 1024 || block[2] > 64 || grid[0] < 1 ||
      grid[1] < 1 || grid[2] < 1 || grid[0] > 2147483647u || grid[1] > 65535 || grid[2] > 65535) {
    fail("invalid launch configuration: grid (%u,%u,%u), block (%u,%u,%u)", grid[0], grid[1], grid[2], block[0],
         block[1], block[2]);
    return -1;
  }
  if (dynamic_bytes > kDynamicSharedCapacity) {
    fail("%llu bytes of dynamic shared memory requested; the emulator has %zu", dynamic_bytes,
         kDynamicSharedCapacity);
    return -1;
  }
  const int n = (int)threads;
  if (!reserve_fibers(n)) {
    fail("out of memory for %d fiber stacks", n);
    return -1;
  }
  engine.body = body;
  engine.closure = closure;
  gridDim = dim3(grid[0], grid[1], grid[2]);
  blockDim = dim3(block[0], block[1], block[2]);
  const SharedMemory shared = locate_shared();
  counters::set_shared(shared.begin, shared.end);
  engine.shared_begin = shared.begin;
  engine.shared_end = shared.end;
  engine.dynamic_end = shared.dynamic + dynamic_bytes;
  engine.dynamic_capacity_end = shared.dynamic + kDynamicSharedCapacity;
  async_copy_set_shared(shared.begin, shared.end);
#ifdef __SANITIZE_ADDRESS__
  __asan_poison_memory_region(shared.dynamic + dynamic_bytes, kDynamicSharedCapacity - dynamic_bytes);
#endif
  const unsigned long long blocks = (unsigned long long)grid[0] * grid[1] * grid[2];
  const bool sampled = engine.only_count >= 0;
  const unsigned long long runs = sampled ? (unsigned long long)engine.only_count : blocks;
  int status = 0;
  for (unsigned long long k = 0; k < runs && status == 0; ++k) {
    const unsigned long long kk = engine.reverse ? runs - 1 - k : k;
    const unsigned long long b = sampled ? engine.only_blocks[kk] : kk;
    if (b >= blocks) {
      fail("block %llu of a grid of %llu blocks was asked for", b, blocks);
      status = -1;
      break;
    }
    blockIdx = uint3{(unsigned)(b % grid[0]), (unsigned)(b / grid[0] % grid[1]), (unsigned)(b / grid[0] / grid[1])};
    poison_shared(shared, dynamic_bytes);
    async_copy_begin_block();
    wgmma_begin_block();
    status = run_block(n);
    counters::end_block(status == 0);
    if (status != 0) {
      char text[sizeof engine.message];
      snprintf(text, sizeof text, "block (%u,%u,%u): %s", blockIdx.x, blockIdx.y, blockIdx.z, engine.message);
      std::memcpy(engine.message, text, sizeof text);
#ifdef __SANITIZE_ADDRESS__
      // The abandoned fibers' frames stay poisoned; later fibers reuse these stacks.
      for (int i = 0; i < n; ++i) __asan_unpoison_memory_region(engine.fibers[i].stack, kStackBytes);
#endif
    }
  }
#ifdef __SANITIZE_ADDRESS__
  __asan_unpoison_memory_region(shared.dynamic, kDynamicSharedCapacity);
#endif
  return status;
}

// ---------------------------------------------------------------------------------------------------------
// Per-kernel glue, instantiated by the generated launchers.

// The type code of one kernel parameter, matched against NumPy dtypes in Python: f2 (__half), bf2
// (__nv_bfloat16), f4, f8, i<bytes>, u<bytes>, b1; a pointer is "p", then "c" if it points to const, then the
// element's code.  "?" marks a type the emulator cannot pass.
template <typename T> void append_code(char* out) {
  if constexpr (std::is_pointer<T>::value) {
    typedef typename std::remove_pointer<T>::type E;
    std::strcat(out, std::is_const<E>::value ? "pc" : "p");
    append_code<typename std::remove_cv<E>::type>(out);
  } else if constexpr (std::is_same<T, __half>::value) {
    std::strcat(out, "f2");
  } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    std::strcat(out, "bf2");
  } else if constexpr (std::is_same<T, bool>::value) {
    std::strcat(out, "b1");
  } else if constexpr (std::is_integral<T>::value || std::is_floating_point<T>::value) {
    char code[8];
    snprintf(code, sizeof code, "%c%zu",
             std::is_floating_point<T>::value ? 'f' : (std::is_signed<T>::value ? 'i' : 'u'), sizeof(T));
    std::strcat(out, code);
  } else {
    std::strcat(out, "?");
  }
}

template <typename... A> const char* signature(void (*)(A...)) {
  static char text[16 * sizeof...(A) + 1];
  if (!text[0]) ((append_code<A>(text), std::strcat(text, ",")), ...);
  return text;
}

template <typename... A> struct Call {
  void (*kernel)(A...);
  void** slots;  // slots[i] points to the value of parameter i
  template <size_t... I> void invoke(std::index_sequence<I...>) { kernel(*static_cast<A*>(slots[I])...); }
  static void run(void* self) { static_cast<Call*>(self)->invoke(std::index_sequence_for<A...>{}); }
};

template <typename... A>
int launch(void (*kernel)(A...), const unsigned* grid, const unsigned* block, unsigned long long shared_bytes,
           void** args, const long long* extents) {
  constexpr int n = (int)sizeof...(A);
  void* slots[n + 1];
  for (int i = 0; i < n; ++i) slots[i] = args[i];
#ifdef __SANITIZE_ADDRESS__
  const bool is_pointer[n + 1] = {std::is_pointer<A>::value..., false};
  const bool is_const[n + 1] = {std::is_const<typename std::remove_pointer<A>::type>::value..., false};
  void* values[n + 1];
  ArgumentCopy copies[n + 1];
  copy_arguments(n, is_pointer, is_const, args, extents, values, slots, copies);
#else
  (void)extents;
#endif
  Call<A...> call{kernel, slots};
  const int status = run_grid(grid, block, shared_bytes, &Call<A...>::run, &call);
#ifdef __SANITIZE_ADDRESS__
  release_arguments(n, copies, status == 0);
#endif
  return status;
}

// ---------------------------------------------------------------------------------------------------------
// Generic shared-memory accesses (ld.shared, st.shared: every load and store of kernel code) against two rules
// of the hardware, in the plain build of a file that uses cp.async and in the profile build: both are compiled with
// ThreadSanitizer's instrumentation (tests/emulator/_build.py), which calls a hook below before each load and
// store; a hook returns after one comparison unless the address is in this library's shared memory.
//   - Bytes that a cp.async of the block still has in flight (emu_async_copy.h's map) may be neither read nor
//     written: the PTX ISA's cp.async "is treated as a weak memory operation" whose completion only
//     cp.async.wait_group / wait_all (or an mbarrier) guarantees, so such an access races with the copy's write
//     (which may land before or after it).  Here the copy lands at its wait, so without this rule the access
//     would see a fixed order that no GPU promises.
//   - The dynamic shared memory ends at the launch's size: an access past it (into the rest of the emulator's
//     227 KiB buffer) is outside the block's shared memory, an illegal address on a GPU.
// The access's place is its return address in this library, "@pc:0x<offset>", which Python turns into file:line
// with addr2line (_device.py); the checked plain build has -g1 for it.

// Whether any of the `bytes` bytes at p is in the dynamic shared buffer past the launch's size (emu_async_copy.h
// asks it of cp.async destinations and ldmatrix rows too).
__attribute__((no_sanitize_thread)) bool past_the_launch(const void* p, int bytes) {
  return (const unsigned char*)p + bytes > engine.dynamic_end && (const unsigned char*)p < engine.dynamic_capacity_end;
}

__attribute__((no_sanitize_thread)) static void shared_access_failure(uintptr_t pc, const char* what) {
  static char where[64];
  Dl_info info;
  snprintf(where, sizeof where, "@pc:0x%llx",
           (unsigned long long)(dladdr((void*)pc, &info) ? pc - (uintptr_t)info.dli_fbase : pc));
  thread_failure(where, 0, what);
}

// The checks of an access in shared memory (the hooks test that first).  Not instrumented itself (its reads of the
// engine would call the hooks again).
__attribute__((no_sanitize_thread, noinline)) static void shared_access(uintptr_t pc, uintptr_t address,
                                                                        unsigned width, bool write) {
  if (!engine.current) return;  // the engine's own accesses (the wgmma collective's operand reads)
  char what[512];
  const uintptr_t end = address + width;
  if (past_the_launch((const void*)address, (int)width)) {
    snprintf(what, sizeof what, "shared %s of %u bytes at byte %llu of the dynamic shared memory, past the %llu "
             "bytes the launch asked for (a GPU faults: illegal address)", write ? "store" : "load", width,
             (unsigned long long)(address - (uintptr_t)emu_dynamic_shared),
             (unsigned long long)(engine.dynamic_end - emu_dynamic_shared));
    shared_access_failure(pc, what);
  }
  const uintptr_t first = address & ~(uintptr_t)(kAsyncWord - 1);  // the whole words the access touches
  int owner;
  const void* at;
  if (const AsyncCopy* c = async_copy_in_flight((const void*)first, (int)(end - first + kAsyncWord - 1) /
                                                kAsyncWord * kAsyncWord, &owner, &at)) {
    snprintf(what, sizeof what, "shared %s of %u bytes at %p, whose word %p a cp.async of thread %d (at %s:%d) still "
             "has in flight: no cp.async.wait_group has landed it, so the copy's write races with this access",
             write ? "store" : "load", width, (void*)address, at, owner, c->file, c->line);
    shared_access_failure(pc, what);
  }
}

}  // namespace emu

#ifdef __SANITIZE_THREAD__
// The instrumentation's entry points (ThreadSanitizer's ABI), in place of its runtime: the rules above, then, in
// the profile build, the memory counters (emu_counters.h).  Every load and store of the library calls one, so
// the hooks are compiled with -O2 whatever the build's level, and most return after one comparison: the address
// is not in shared memory (global memory, a fiber's stack, the engine's data).
#define EMU_TSAN_HOOK \
  extern "C" __attribute__((visibility("hidden"), no_sanitize_thread, noinline, optimize("O2"))) void
#ifdef EMU_PROFILE
#define EMU_COUNT(pc, address, width, write) emu::counters::record(pc, address, width, write)
#else
#define EMU_COUNT(pc, address, width, write) (void)0
#endif
#define EMU_CHECKED_ACCESS(address, width, write)                                                         \
  do {                                                                                                    \
    const uintptr_t pc = (uintptr_t)__builtin_return_address(0);                                          \
    if ((uintptr_t)(address) - (uintptr_t)emu::engine.shared_begin <                                      \
        (uintptr_t)(emu::engine.shared_end - emu::engine.shared_begin))                                   \
      emu::shared_access(pc, (uintptr_t)(address), width, write);                                         \
    EMU_COUNT(pc, (uintptr_t)(address), width, write);                                                    \
  } while (0)
#define EMU_TSAN_ACCESS(name, width, write) \
  EMU_TSAN_HOOK name(void* address) { EMU_CHECKED_ACCESS(address, width, write); }
EMU_TSAN_ACCESS(__tsan_read1, 1, false)
EMU_TSAN_ACCESS(__tsan_read2, 2, false)
EMU_TSAN_ACCESS(__tsan_read4, 4, false)
EMU_TSAN_ACCESS(__tsan_read8, 8, false)
EMU_TSAN_ACCESS(__tsan_read16, 16, false)
EMU_TSAN_ACCESS(__tsan_write1, 1, true)
EMU_TSAN_ACCESS(__tsan_write2, 2, true)
EMU_TSAN_ACCESS(__tsan_write4, 4, true)
EMU_TSAN_ACCESS(__tsan_write8, 8, true)
EMU_TSAN_ACCESS(__tsan_write16, 16, true)
EMU_TSAN_ACCESS(__tsan_unaligned_read2, 2, false)
EMU_TSAN_ACCESS(__tsan_unaligned_read4, 4, false)
EMU_TSAN_ACCESS(__tsan_unaligned_read8, 8, false)
EMU_TSAN_ACCESS(__tsan_unaligned_read16, 16, false)
EMU_TSAN_ACCESS(__tsan_unaligned_write2, 2, true)
EMU_TSAN_ACCESS(__tsan_unaligned_write4, 4, true)
EMU_TSAN_ACCESS(__tsan_unaligned_write8, 8, true)
EMU_TSAN_ACCESS(__tsan_unaligned_write16, 16, true)
EMU_TSAN_ACCESS(__tsan_volatile_read1, 1, false)
EMU_TSAN_ACCESS(__tsan_volatile_read2, 2, false)
EMU_TSAN_ACCESS(__tsan_volatile_read4, 4, false)
EMU_TSAN_ACCESS(__tsan_volatile_read8, 8, false)
EMU_TSAN_ACCESS(__tsan_volatile_read16, 16, false)
EMU_TSAN_ACCESS(__tsan_volatile_write1, 1, true)
EMU_TSAN_ACCESS(__tsan_volatile_write2, 2, true)
EMU_TSAN_ACCESS(__tsan_volatile_write4, 4, true)
EMU_TSAN_ACCESS(__tsan_volatile_write8, 8, true)
EMU_TSAN_ACCESS(__tsan_volatile_write16, 16, true)
#undef EMU_TSAN_ACCESS
// An aggregate of another size (a 12-byte struct copy): one access of its size.
EMU_TSAN_HOOK __tsan_read_range(void* address, unsigned long size) {
  EMU_CHECKED_ACCESS(address, (unsigned)size, false);
}
EMU_TSAN_HOOK __tsan_write_range(void* address, unsigned long size) {
  EMU_CHECKED_ACCESS(address, (unsigned)size, true);
}
#undef EMU_CHECKED_ACCESS
#undef EMU_COUNT
#ifdef EMU_PROFILE  // the plain build is compiled without them (--param=tsan-instrument-func-entry-exit=0)
EMU_TSAN_HOOK __tsan_func_entry(void* caller) { emu::counters::push_frame((uintptr_t)caller); }
EMU_TSAN_HOOK __tsan_func_exit() { emu::counters::pop_frame(); }
#endif
EMU_TSAN_HOOK __tsan_init() {}
EMU_TSAN_HOOK __tsan_vptr_update(void**, void*) {}
EMU_TSAN_HOOK __tsan_vptr_read(void**) {}
#undef EMU_TSAN_HOOK
#endif  // __SANITIZE_THREAD__

extern "C" {
void emu_set_order(int reverse) { emu::engine.reverse = reverse != 0; }
// Run only these blocks (linear indices x + gx * (y + gy * z), in this order) of the following launches;
// count -1: every block again.  The grid keeps its size: gridDim, and every index computed from it, are those of
// the whole launch.
void emu_set_blocks(const unsigned long long* blocks, long long count) {
  emu::engine.only_blocks = blocks;
  emu::engine.only_count = count;
}
const char* emu_error() { return emu::engine.message; }
int emu_sanitized() {
#ifdef __SANITIZE_ADDRESS__
  return 1;
#else
  return 0;
#endif
}
}
