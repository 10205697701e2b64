"""The host cost of a GPU call stays low: Python function calls per call of representative ops, counted (not timed)
by benchmarks.host_overhead on its NullGpu (CupyHostDevice with no-op memory, kernels and cuBLAS).

The first GPU run (2026-11-26, H200) measured every cupyconv call host-bound: 170-800 us of Python per forward
call against 9-80 us of kernels.  The counts are deterministic for one Python, NumPy and CuPy; the bounds are the
counts after the repeated-call fast path (cupyconv/_fastpath.py, benchmarks/RESULTS.md "Host cost of a repeated
call") with about 25% of margin, and well below the counts before it (in brackets: after the host-cost work and
launch replay), so that a change that brings the per-call checks back fails here.  "Above" counts what runs
outside the lift drivers and the launch replay (`_replay.Program.run`):

  case-pass               calls per call (before)   above the drivers and replay (before)
  r50-64-gpu16 fwd        82 (199)                  34 (106)      conv2d forward, implicit GEMM
  dw-480-14-gpu16 fwd     52 (156)                  36 (103)      depthwise forward
  p-seed-gpu16 fwd+bwd    217 (474)                 69 (222)      patch forward and backward
"""
from __future__ import annotations

import pytest

pytest.importorskip("cupy")

from benchmarks import cases, host_overhead  # noqa: E402

BOUNDS = {   # (case, backward): (calls per call, of which above the lift drivers)
    ("r50-64-gpu16", False): (103, 43),
    ("dw-480-14-gpu16", False): (65, 45),
    ("p-seed-gpu16", True): (272, 87),
}


@pytest.mark.parametrize("label, backward", list(BOUNDS))
def test_function_calls_per_gpu_call_stay_under_their_bound(label, backward):
    case = cases.select([label], ("gpu",))[0]
    figures, _ = host_overhead.measure(case, backward, calls=3, timing=False)
    calls, above = BOUNDS[label, backward]
    assert 0 < figures["above"] <= figures["calls"]
    assert figures["calls"] <= calls and figures["above"] <= above, (
        f"{label} {'fwd+bwd' if backward else 'fwd'}: {figures['calls']:.0f} Python function calls per call, "
        f"{figures['above']:.0f} of them above the lift drivers; the bounds are {calls} and {above} (see "
        f"`python -m benchmarks.host_overhead --cases {label} --top 40` for where they go)")


def test_the_null_gpu_runs_the_gpu_path_without_touching_memory():
    """The instrument measures the GPU path (CupyHostDevice's CudaDevice, cupy.ndarrays of the case's shapes), not
    the CPU path: the result is a cupy.ndarray of the forward output's shape."""
    import cupy
    case = cases.select(["r50-64-gpu16"], ("gpu",))[0]
    device, fn = host_overhead.build(case, False)
    with host_overhead.on_null_gpu(device, case):
        (y,) = fn()
    assert isinstance(y, cupy.ndarray) and y.shape == cases.shapes(case)["y"]
