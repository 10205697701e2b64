// The warpgroup calls' record, shared by the kernel-facing stand-in (emu_wgmma.h) and the engine
// (emu_runtime.h, wgmma_collective), which includes this whether or not a kernel uses wgmma.
#pragma once

namespace emu {
enum WgmmaOp { WGMMA_FENCE = 1, WGMMA_MMA = 2, WGMMA_COMMIT = 3, WGMMA_WAIT = 4 };
struct WgmmaCall {
  int op;
  int n;     // mma: N of m64nNk16 (m64nNk8 for tf32)
  int type;  // mma: WgmmaType<T>::type (raw_kernels/wgmma.cuh): 0 __half, 1 __nv_bfloat16, 2 float as tf32
  unsigned long long desc_a, desc_b;
  float* d;  // mma: the N / 2 accumulators
  int accumulate;
  int wait;  // wait: N of wait_group
};
void warpgroup_call(const char* file, int line, const WgmmaCall* call);  // emu_runtime.h
void proxy_fence();                                                      // emu_runtime.h

// The emulated shared-window address of p: its offset from the block's shared memory rounded down to 1024 bytes
// (emu_runtime.h), so that a shared variable's alignment, and with it the swizzle pattern, is the one it has on a
// GPU, whose shared window starts at 0.
unsigned shared_window_address(const void* p);
}  // namespace emu
