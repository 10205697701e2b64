"""Timers and statistics for the benchmark harness.

CPU: `time.perf_counter` around one call.  GPU: CUDA events recorded on the stream the contender launches on,
after a full device synchronisation (nothing earlier is in flight), read after synchronising on the end
event; a wall-clock time around (synchronise, call, synchronise) is kept beside it as a cross-check that also
shows the host-side launch overhead.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


def time_cpu(fn) -> dict:
    """Seconds taken by one call of fn on the CPU."""
    t0 = time.perf_counter()
    fn()
    return {"s": time.perf_counter() - t0}


class CudaTimer:
    """Times one call of fn on the GPU with CUDA events.

    `library` is the array library whose current stream the contender launches on: "cupy" (cupyconv on CuPy
    arrays; also cupyconv on torch tensors inside `cupy.cuda.ExternalStream(torch's current stream)`, timed
    with "torch") or "torch".  Events are recorded on that library's current stream.
    """

    def __init__(self, library: str):
        self.library = library
        if library == "cupy":
            import cupy
            self._cupy = cupy
        elif library == "torch":
            import torch
            self._torch = torch
        else:
            raise ValueError(f"CudaTimer: library must be 'cupy' or 'torch', got {library!r}")

    def synchronize(self) -> None:
        """Wait for all work on the current device (every stream) to finish."""
        if self.library == "cupy":
            self._cupy.cuda.Device().synchronize()
        else:
            self._torch.cuda.synchronize()

    def _events(self):
        """A start and an end timing event, and a function giving the seconds between them once recorded."""
        if self.library == "cupy":
            cp = self._cupy
            start, end = cp.cuda.Event(), cp.cuda.Event()
            return start, end, lambda: cp.cuda.get_elapsed_time(start, end) / 1e3
        torch = self._torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return start, end, lambda: start.elapsed_time(end) / 1e3

    def __call__(self, fn) -> dict:
        self.synchronize()
        start, end, elapsed = self._events()
        t0 = time.perf_counter()
        start.record()  # on the current stream (both libraries' default)
        fn()
        end.record()
        end.synchronize()
        wall = time.perf_counter() - t0
        self.synchronize()  # anything fn launched on another stream is finished before the next sample
        return {"s": elapsed(), "wall_s": wall}


@dataclass
class Samples:
    """Per-call times of one contender, in seconds (and the wall-clock cross-check on the GPU)."""
    s: list = field(default_factory=list)
    wall_s: list = field(default_factory=list)

    def add(self, sample: dict) -> None:
        self.s.append(sample["s"])
        if "wall_s" in sample:
            self.wall_s.append(sample["wall_s"])

    def summary(self) -> dict:
        s = sorted(self.s)
        q = statistics.quantiles(s, n=4, method="inclusive") if len(s) >= 2 else [s[0]] * 3
        med = statistics.median(s)
        out = {
            "n": len(s),
            "median_ms": med * 1e3,
            "min_ms": s[0] * 1e3,
            "p25_ms": q[0] * 1e3,
            "p75_ms": q[2] * 1e3,
            "max_ms": s[-1] * 1e3,
            # Spread of the samples: interquartile range relative to the median.
            "iqr_pct": (q[2] - q[0]) / med * 100 if med > 0 else 0.0,
        }
        if self.wall_s:
            out["wall_median_ms"] = statistics.median(self.wall_s) * 1e3
        return out
