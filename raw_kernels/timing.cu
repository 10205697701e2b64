// What autotuning times with, not an op (cupyconv/_autotune.py `gpu_time`).
//
// CUDA events around a call on an idle stream time the host too: the GPU reaches the start event at once, then
// waits for each launch the host has yet to make.  timing_spin, launched just before the start event, keeps the
// stream busy while the host enqueues the call, so that the GPU runs the call's work back to back and the
// events time the GPU alone (provided the spin outlasts the enqueue, which `gpu_time` checks).
//
// The CPU emulator runs it too: its clock64() is the host's monotonic clock, an SM at 1 GHz.

// One thread busy-waits for `cycles` of its SM's clock.  A template on <T, I> like every kernel (the tooling
// reads name expressions kernel<T, I>); it touches no memory, so one instantiation serves: <float, int>.
template <typename T, typename I>
__global__ void timing_spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
