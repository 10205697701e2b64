"""Resolving algorithm='auto': the op's shape heuristic, or the measured fastest candidate.

An op hands `resolve` its candidates for one pass, the heuristic's pick and a function that runs a named
algorithm.  With `settings.get_autotune()` on (and `settings.get_deterministic()` off), the first call of each
(pass, geometry, dtype, device) runs every candidate twice, once to compile and warm up and once timed
(`Device.timed`: CUDA events on a GPU), and the fastest is remembered in CACHE for the rest of the process.
"""
from __future__ import annotations

import dataclasses

import numpy

from . import settings
from ._spec import ConvSpec

CACHE: dict = {}


def tune_key(pass_name: str, spec: ConvSpec, dtype, *extra) -> tuple:
    """What makes two calls the same problem for autotuning (the op name in error messages does not).  The TF32
    setting is part of it: it changes the candidates (float32 on the tensor cores) and what they compute."""
    return (pass_name, dataclasses.replace(spec, op=""), numpy.dtype(dtype).name, settings.get_allow_tf32(), *extra)


def resolve(device, key: tuple, algorithm: str, candidates: tuple[str, ...], heuristic: str, run):
    """run(algorithm), with 'auto' resolved by the heuristic or, when autotuning, by measurement."""
    if algorithm != "auto":
        return run(algorithm)
    if not settings.get_autotune() or settings.get_deterministic() or len(candidates) == 1:
        return run(heuristic if heuristic in candidates else candidates[0])
    key = (*key, device.key())
    if key in CACHE:
        return run(CACHE[key])
    timings = {}
    for candidate in candidates:
        run(candidate)  # compile and warm up
        timings[candidate] = device.timed(lambda: run(candidate))
    best = min(candidates, key=lambda c: timings[c][0])
    CACHE[key] = best
    return timings[best][1]
