// Kernels for benchmarks.executed's self-tests (tests/test_executed.py): launches whose executed instructions
// differ from their static ones in known ways.  Compiled by NVRTC (for their SASS and line table) and by the
// emulator (for the counters' per-site warp requests).  Not shipped.

// A loop with a run-time trip count (kept a loop: unroll 1), whose every trip loads and uses a global value
// (one load latency a trip), and a branch that no thread takes when rare == 0: its 16 unrolled loads are
// static instructions a launch never runs.
__global__ void executed_loop(const float* x, float* y, int trips, int rare) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0.0f;
#pragma unroll 1
  for (int i = 0; i < trips; ++i) s = s * 0.5f + x[i * 64 + t];  // @loop
  if (rare) {
    float r = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) r += x[j * 64 + t] * x[(j + 1) * 64 + t];  // @rare
    s += r;
  }
  y[t] = s;
}

// The same loop unrolled by 4 with its remainder: 5 SASS copies of one source load, which the estimate shares
// the load's requests among.
__global__ void executed_unrolled(const float* x, float* y, int trips) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0.0f;
#pragma unroll 4
  for (int i = 0; i < trips; ++i) s = s * 0.5f + x[i * 64 + t];  // @unrolled
  y[t] = s;
}

// A pipeline of two stages: one helper stages an element of x in shared memory, inlined for the first trip's
// element before the loop (the prologue) and for the next trip's inside it: one source line, SASS copies that run
// once and `trips` times a thread (an equal share of the site's requests would charge each (1 + trips) / 2).
__global__ void executed_pipeline(const float* x, float* y, int trips) {
  __shared__ float stage[2][64];
  const int t = threadIdx.x;
  auto issue = [&](int i) { stage[i & 1][t] = x[i * 64 + t]; };  // @pipeline
  issue(0);
  float s = 0.0f;
#pragma unroll 1
  for (int i = 0; i < trips; ++i) {
    __syncthreads();
    issue(i + 1);
    s = s * 0.5f + stage[i & 1][t];  // @use
    __syncthreads();
  }
  y[t] = s;
}
