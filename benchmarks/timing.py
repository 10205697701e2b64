"""Timers and statistics for the benchmark harness: two figures per contender, each labelled (`TIMING`).

CPU: `time.perf_counter` around one call; that is both its time and its latency.

GPU: the GPU time of queued work, CUDA events recorded on the stream the contender launches on around `count`
calls enqueued back to back, divided by `count` (the figure the ratios and the roofline use: the host's planning
of one call overlaps the GPU's work on the previous ones, as in a real pipeline); and beside it the end-to-end
latency of one call, the wall clock around (synchronise, call, synchronise), host planning and launch overhead
included.  Events bracketing one call on an idle device, as before, measured neither: the GPU waited for the
host inside the bracket.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


#: What each figure of `Samples.summary` is, for the JSON and the report.
TIMING = {
    "cpu": {"median_ms": "wall clock of one call (time.perf_counter)",
            "latency_median_ms": "the same wall clock: on the CPU, time per call and latency are one figure"},
    "gpu": {"median_ms": "GPU time of queued work: CUDA events on the contender's stream around many calls enqueued "
                         "back to back (calls_per_turn), divided by their count",
            "latency_median_ms": "end-to-end latency per call: wall clock around (synchronise, one call, "
                                 "synchronise)"},
}


def time_cpu(fn, count: int = 1) -> dict:
    """Seconds taken by one call of fn on the CPU (count is for the GPU timer's interface: one call here)."""
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return {"s": seconds, "latency_s": seconds}


class CudaTimer:
    """Times fn on the GPU: the GPU time per call of `count` queued calls (CUDA events) and one call's latency.

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

    def __call__(self, fn, count: int = 1) -> dict:
        """{"s": GPU seconds per call of `count` calls enqueued between two events, "latency_s": wall-clock seconds
        of one more call from an idle device to its completion}."""
        self.synchronize()
        t0 = time.perf_counter()
        fn()
        self.synchronize()
        latency = time.perf_counter() - t0
        start, end, elapsed = self._events()
        start.record()  # on the current stream (both libraries' default)
        for _ in range(count):
            fn()
        end.record()
        end.synchronize()
        self.synchronize()  # anything fn launched on another stream is finished before the next sample
        return {"s": elapsed() / count, "latency_s": latency, "queued_calls": count}


@dataclass
class Samples:
    """Per-call times of one contender, in seconds: time per call and end-to-end latency (`TIMING` says what
    each is on each device)."""
    s: list = field(default_factory=list)
    latency_s: list = field(default_factory=list)

    def add(self, sample: dict) -> None:
        self.s.append(sample["s"])
        self.latency_s.append(sample.get("latency_s", sample["s"]))

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
        out["latency_median_ms"] = statistics.median(self.latency_s) * 1e3
        return out
