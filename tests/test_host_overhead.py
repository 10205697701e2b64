"""The host cost of a GPU call stays low: Python function calls per call of representative ops, counted (not timed)
by benchmarks.host_overhead on its NullGpu (CupyHostDevice with no-op memory, kernels and cuBLAS).

The first GPU run (2026-11-26, H200) measured every cupyconv call host-bound: 170-800 us of Python per forward
call against 9-80 us of kernels.  The counts are deterministic for one Python, NumPy and CuPy; the bounds are the
counts after the repeated-call fast path (cupyconv/_fastpath.py, benchmarks/RESULTS.md "Host cost of a repeated
call") with about 25% of margin, and well below the counts before it (in brackets: after the host-cost work and
launch replay), so that a change that brings the per-call checks back fails here.  "Above" counts what runs
outside the lift drivers and the launch replay (`_replay.Program.run`):

  case-pass               calls per call (before)   above the drivers and replay (before)
  r50-64-gpu16 fwd        61 (199)                  33 (106)      conv2d forward, implicit GEMM
  dw-480-14-gpu16 fwd     50 (156)                  35 (103)      depthwise forward
  p-seed-gpu16 fwd+bwd    160 (474)                 67 (222)      patch forward and backward

(after task hostlaunch, 2026-11-26: scratch arrays pooled (`_replay._pooled`), CUPYCONV_REPLAY read without a
KeyError; 68 / 37, 54 / 39 and 185 / 75 before it.)
"""
from __future__ import annotations

import gc

import pytest

pytest.importorskip("cupy")

from benchmarks import cases, host_overhead  # noqa: E402

BOUNDS = {   # (case, backward): (calls per call, of which above the lift drivers)
    ("r50-64-gpu16", False): (76, 41),
    ("dw-480-14-gpu16", False): (63, 44),
    ("p-seed-gpu16", True): (200, 84),
    # conv_transpose2d on the fast path, its phases in one launch: 87 calls, 33 above (459 and 292 before both)
    ("ct2d-k4s2-gpu16", False): (109, 41),
}

# Allocations per repeated call (exact counts, not bounds with margin: each is a few microseconds of host time on a
# GPU, 2.9 us in the H100's host model): the tensor-core forward makes its output (carrying the channels-last weight,
# `_replay._pooled`) and the channels-last copy of x it offers; the backward its scratch in one arena, grad_input
# (carrying the weight's copy), grad_weight and grad_bias.  3 and 11 before task hostlaunch, 5 and 15 before hostcut.
ALLOCATIONS = {("r50-64-gpu16", False): 2, ("r50-64-gpu16", True): 6, ("p-seed-gpu16", True): 6,
               ("iii-gpu32", True): 3}


# The same through cupyconv.torch (autograd), what a torch user runs (`host_overhead --torch`: CPU tensors down the
# CUDA branch, its fakes not counted): the counts after the fast path for torch tensors and the cached stream and
# allocator, the eager calls and the kept memory formats (benchmarks/RESULTS.md "Host cost of the torch path": r50-64
# fwd 279 / 231, dw-480-14 fwd 252 / 236, p-seed fwd+bwd 648 / 500) with ~25% of margin, below those before them
# (467 / 392, 439 / 396, 986 / 784)
TORCH_BOUNDS = {
    ("r50-64-gpu16", False): (349, 289),
    ("dw-480-14-gpu16", False): (315, 295),
    ("p-seed-gpu16", True): (810, 625),
    ("ct2d-k4s2-gpu16", False): (350, 250),   # 281 / 199 (717 / 550 before the fast path)
}


@pytest.mark.parametrize("label, backward, torch", [(*key, False) for key in BOUNDS] +
                         [(*key, True) for key in TORCH_BOUNDS])
def test_function_calls_per_gpu_call_stay_under_their_bound(label, backward, torch):
    if torch:
        pytest.importorskip("torch")
    case = cases.select([label], ("gpu",))[0]
    figures, _ = host_overhead.measure(case, backward, calls=3, timing=False, torch=torch)
    calls, above = (TORCH_BOUNDS if torch else BOUNDS)[label, backward]
    assert 0 < figures["above"] <= figures["calls"]
    assert figures["calls"] <= calls and figures["above"] <= above, (
        f"{label} {'fwd+bwd' if backward else 'fwd'}: {figures['calls']:.0f} Python function calls per call, "
        f"{figures['above']:.0f} of them above the lift drivers; the bounds are {calls} and {above} (see "
        f"`python -m benchmarks.host_overhead --cases {label} --top 40{' --torch' if torch else ''}` for where they "
        f"go)")


@pytest.mark.parametrize("label, backward", list(ALLOCATIONS))
def test_allocations_per_repeated_call(label, backward):
    case = cases.select([label], ("gpu",))[0]
    figures = host_overhead.counts(case, backward, calls=2)
    assert figures["allocations"] <= ALLOCATIONS[label, backward], (
        f"{label} {'fwd+bwd' if backward else 'fwd'}: {figures['allocations']:g} allocations per repeated call, "
        f"expected {ALLOCATIONS[label, backward]}")


def test_the_null_gpu_runs_the_gpu_path_without_touching_memory():
    """The instrument measures the GPU path (CupyHostDevice's CudaDevice, cupy.ndarrays of the case's shapes), not
    the CPU path: the result is a cupy.ndarray of the forward output's shape."""
    import cupy
    case = cases.select(["r50-64-gpu16"], ("gpu",))[0]
    device, fn = host_overhead.build(case, False)
    with host_overhead.on_null_gpu(device, case):
        (y,) = fn()
    assert isinstance(y, cupy.ndarray) and y.shape == cases.shapes(case)["y"]


def test_the_torch_instrument_runs_cupyconv_torchs_cuda_branch():
    """--torch takes torch CPU tensors down cupyconv.torch's CUDA branch (not torch's CPU convolutions): the plain
    function runs on NullGpu, the result is a torch tensor of the forward output's shape, and the fakes are undone."""
    torch = pytest.importorskip("torch")
    from cupyconv.torch import cpu, cuda
    case = cases.select(["dw-480-14-gpu16"], ("gpu",))[0]
    device, fn = host_overhead.build(case, False, torch=True)
    with host_overhead.on_null_gpu(device, case), host_overhead.torch_on_null_gpu():
        before = device.counts["launches"]
        (y,) = fn()
        assert device.counts["launches"] > before
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == cases.shapes(case)["y"]
    assert cuda.DEVICE_TYPE == "cuda" and cpu.runs_on_torch.__module__ == "cupyconv.torch.cpu"


@pytest.mark.parametrize("label, backward, tunes", [("r50-64-gpu16", False, True), ("r50-64-gpu16", True, True),
                                                    ("p-seed-gpu16", True, False)])   # patch: 'auto' never tunes
def test_an_autotuned_repeat_costs_what_the_heuristics_costs(label, backward, tunes, monkeypatch):
    """With autotuning on and its choice cached (every candidate timed alike: the heuristic's pick kept), a repeated
    call takes the same fast path as with autotuning off: the same Python calls, launches and allocations.  (The
    first H100 run timed the benchmark's calls, autotune on, above host_profile's, autotune off, by as much on cases
    that autotune nothing: benchmarks/RESULTS.md "Autotune on and off".)"""
    from cupyconv import _autotune
    case = cases.select([label], ("gpu",))[0]
    cache = dict(_autotune.CACHE)
    timed = []
    monkeypatch.setattr(host_overhead, "_tie", lambda run: (timed.append(run) or 0.0, run()))
    gc.collect()   # a collection inside one of the two windows ran other tests' finalisers (CI, 2026-11-26:
    gc.disable()   # 186.7 against 185.3 calls a call): none runs in them now
    try:
        off, _ = host_overhead.measure(case, backward, calls=3, timing=False)
        assert not timed
        on, _ = host_overhead.measure(case, backward, calls=3, timing=False, autotune=True)
    finally:
        gc.enable()
    assert (len(timed) >= 2) == tunes and _autotune.CACHE == cache   # candidates timed; the cache left as found
    assert {k: on[k] for k in ("launches", "allocations")} == {k: off[k] for k in ("launches", "allocations")}
    for k in ("calls", "above"):   # (within two calls a call: a stray finaliser, not another path)
        assert on[k] == pytest.approx(off[k], abs=2), k
