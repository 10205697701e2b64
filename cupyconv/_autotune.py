"""Resolving algorithm='auto': the op's shape heuristic, or the measured fastest candidate.

An op hands `resolve` its candidates for one pass, the heuristic's pick and a function that runs a named
algorithm.  With `settings.get_autotune()` on (and `settings.get_deterministic()` off), the first call of each
(pass, geometry, dtype, device) runs every candidate once to compile and warm up, then times it with
`Device.timed` (the heuristic's pick first and again last), and the one kept is remembered in CACHE for the rest
of the process: the heuristic's pick, unless another candidate took at least TIE_MARGIN less time (`keep`).  The
heuristic's plan is the one the model predicts and the one the library runs by default; a candidate that only
ties it, within timing noise, would make the autotuned plan differ from both for nothing.

On a GPU, `Device.timed` is `gpu_time`: the GPU's time for the candidate's work alone, whatever the host spends
enqueuing it.  CUDA events around a call on an idle stream would time the host as well (the GPU reaches the
start event at once and then waits for each launch), and the candidate with the least Python would win: on the
first GPU run (H200) that picked conv_fwd_direct (529 us of kernel) over the implicit GEMM (47 us) for r50-64
float16.  `gpu_time` first launches `timing_spin` (raw_kernels/timing.cu), a one-thread kernel that busy-waits
while the host enqueues the call behind it, so that the GPU then runs the call back to back between the events.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import numpy

from . import settings
from ._kernels import KernelFile, kernel_name
from ._spec import ConvSpec

CACHE: dict = {}
#: The candidates' timed seconds by the same keys as CACHE ({candidate: seconds}), for reports
#: (`benchmarks.run` records them with each case's picks).
MEASURED: dict = {}

# A candidate replaces the heuristic's pick only if its time is below (1 - TIE_MARGIN) x the pick's: each time is
# the median of REPEATS repetitions (`gpu_time`), which vary by a few percent on a GPU from run to run.
TIE_MARGIN = 0.05

KERNELS = KernelFile("timing.cu")

# gpu_time's spin: at least SPIN_MARGIN times the host time of an untimed call, within [SPIN_MIN_S, SPIN_FIRST_MAX_S]
# at first; doubled after each repetition it did not cover, up to SPIN_MAX_S, where a repetition counts whatever
# it covered (only a call that waits for the GPU itself outlasts 50 ms of spin).
REPEATS = 3
SPIN_MARGIN = 2.0
SPIN_MIN_S = 100e-6
SPIN_FIRST_MAX_S = 5e-3
SPIN_MAX_S = 50e-3

host_clock = time.perf_counter   # the host's clock (tests replace it with a simulated one)


def instantiations():
    return [kernel_name("timing_spin", "float32", "int")]


def tune_key(pass_name: str, spec: ConvSpec, dtype, *extra) -> tuple:
    """What makes two calls the same problem for autotuning (the op name in error messages does not).  The TF32
    setting is part of it: it changes the candidates (float32 on the tensor cores) and what they compute."""
    return (pass_name, dataclasses.replace(spec, op=""), numpy.dtype(dtype).name, settings.get_allow_tf32(), *extra)


def resolve(device, key: tuple, algorithm: str, candidates: tuple[str, ...], heuristic: str, run):
    """run(algorithm), with 'auto' resolved by the heuristic or, when autotuning, by measurement (the fastest
    candidate's result is returned)."""
    choice = chosen(device, key, algorithm, candidates, heuristic)
    if choice is not None:
        return run(choice)
    key = (*key, device.key())
    preferred = _preferred(candidates, heuristic)
    timings = {}
    for candidate in (preferred, *[c for c in candidates if c != preferred]):
        run(candidate)  # compile and warm up
        timings[candidate] = device.timed(lambda: run(candidate))
    # the heuristic's pick again, last: a GPU clock still ramping up, or other work on the GPU, while it was timed
    # first must not count against it alone (its time is the shorter of the two)
    again = device.timed(lambda: run(preferred))
    if again[0] < timings[preferred][0]:
        timings[preferred] = again
    seconds = {candidate: timing[0] for candidate, timing in timings.items()}
    best = CACHE[key] = keep(seconds, preferred)
    MEASURED[key] = seconds
    return timings[best][1]


def keep(seconds: dict, preferred: str) -> str:
    """The candidate autotuning keeps, from each candidate's timed seconds: the fastest where it beats `preferred`
    (the heuristic's pick) by TIE_MARGIN of preferred's time, else preferred (ties and near-ties go to it)."""
    fastest = min(seconds, key=seconds.__getitem__)
    return fastest if seconds[fastest] < (1 - TIE_MARGIN) * seconds[preferred] else preferred


def _preferred(candidates: tuple[str, ...], heuristic: str) -> str:
    """What 'auto' runs without autotuning: the heuristic's pick, or the first candidate where the pick is not
    among them (the direct input gradient at a stride other than 1: the heuristic's run falls back to it)."""
    return heuristic if heuristic in candidates else candidates[0]


def chosen(device, key: tuple, algorithm: str, candidates: tuple[str, ...], heuristic: str) -> str | None:
    """The algorithm `resolve` runs without measuring, or None where it will measure candidates (autotuning a
    problem not in the cache)."""
    if algorithm != "auto":
        return algorithm
    if not settings.get_autotune() or settings.get_deterministic() or len(candidates) == 1:
        return _preferred(candidates, heuristic)
    return CACHE.get((*key, device.key()))


def spin(device, seconds: float) -> None:
    """Launch timing_spin on the current stream for `seconds` of the device's clock (`device.clock_rate`, Hz)."""
    KERNELS.launch(device, "timing_spin", dtype="float32", index="int", grid=1, block=1,
                   cycles=max(1, round(seconds * device.clock_rate)))


def gpu_time(device, run) -> tuple[float, object]:
    """(seconds of GPU time, result) of run() on a CUDA device (`CudaDevice.timed`): the median of REPEATS
    repetitions, each timed by CUDA events on the current stream behind a `spin` that keeps the GPU busy while
    the host enqueues run()'s work.

    A repetition counts only if the spin covered the whole enqueue: its start event, which the GPU reaches when the
    spin ends, must still be pending when the stop event has been recorded.  Otherwise the GPU may have waited
    for the host between the events, and the repetition is made again with twice the spin.  The first spin is
    sized from the host time of one untimed call (`host_clock`), so that the spin costs the GPU about what the
    host costs anyway."""
    cuda = device.xp.cuda
    begin = host_clock()
    result = run()
    spin_s = min(max(SPIN_MARGIN * (host_clock() - begin), SPIN_MIN_S), SPIN_FIRST_MAX_S)
    times: list[float] = []
    while len(times) < REPEATS:
        start, stop = cuda.Event(), cuda.Event()
        spin(device, spin_s)
        start.record()
        result = run()
        stop.record()
        covered = not start.done
        stop.synchronize()
        if covered or spin_s >= SPIN_MAX_S:
            times.append(cuda.get_elapsed_time(start, stop) / 1e3)
        else:
            spin_s = min(2 * spin_s, SPIN_MAX_S)
    return statistics.median(times), result
