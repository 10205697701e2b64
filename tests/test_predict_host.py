"""benchmarks.predict's host model: every case-pass gets a predicted host time from what benchmarks.host_overhead
counts on the CPU (Python function calls, launches and scalar arguments CuPy wraps per call), with constants
fitted to the H200's and the H100's measured host times; its wall time is max(GPU, host), since the H200 found
every forward host-bound.  That every case-pass gets a host range is checked with the rest of its prediction
(tests/test_predict.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cupy")

from benchmarks import cases, host_overhead, predict  # noqa: E402

MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-2026-11-26" / "after-fixes"
MEASURED_H100 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-2026-11-26-h100"


def test_the_wall_time_is_the_larger_of_gpu_and_host():
    """iii-gpu32's forward: about 6-17 us of kernel against about 23-42 us of host (the H100 measured 11.1 and 36.7
    before launches were prepared): host-bound, its wall time the host's."""
    case = cases.select(["iii-gpu32"], ("gpu",))[0]
    sass = predict.SassSource(enabled=False)
    result = predict.predict_case(case, False, "h200", sass, counters=False)
    assert result["wall_us"] == [max(g, h) for g, h in zip(result["predicted_us"], result["host_us"])]
    assert result["host_bound"] and result["wall_us"] == result["host_us"]
    assert "host" in predict.table([result]).splitlines()[1]
    brief = predict.brief(result)
    assert brief["host_us"] == result["host_us"] and brief["wall_us"] == result["wall_us"]


def test_the_calibration_reproduces_the_measured_h200_pairs():
    """The H200 pairs' measured host times are those of the committed H200 profile, and their fit (`fit_host`)
    gives the model its per-call constant."""
    measured = json.loads((MEASURED / "host_profile.json").read_text())
    for label, pass_, host_us, *_ in predict.HOST_PAIRS:
        key = f"{label}-{'fwd' if pass_ == 'fwd' else 'fwdbwd'}"
        assert host_us == pytest.approx(measured[key]["host_us"], abs=0.05), key
    assert len(predict.HOST_PAIRS) == len(measured) == 12
    assert predict.fit_host() == {"per_call_us": 0.334, "per_launch_us": 28.6, "spread": (0.91, 1.33)}
    assert predict.fit_host()["per_call_us"] == predict.HOST_MODEL["per_call_us"]


def test_the_calibration_reproduces_the_measured_h100_pairs():
    """The H100 pairs' measured host times are those of the committed H100 profile (autotune off); the constants
    written out in HOST_MODEL are their fit (`fit_host_h100`); and every measured host time falls inside its
    predicted range (the spread is the fit's own extremes, so this holds by construction -- what it guards is that
    a change to the constants or the formula that no longer fits the measurements fails here)."""
    measured = json.loads((MEASURED_H100 / "bench.json").read_text())["profile"]
    for label, pass_, host_us, *_ in predict.HOST_PAIRS_H100:
        key = f"{label}-{'fwd' if pass_ == 'fwd' else 'fwdbwd'}"
        assert host_us == pytest.approx(measured[key]["host_us"], abs=0.05), key
    assert len(predict.HOST_PAIRS_H100) == len(measured) == 16
    assert predict.fit_host_h100() == predict.HOST_MODEL
    low, high = predict.HOST_MODEL["spread"]
    assert 0.8 <= low <= 1 <= high <= 1.5, "a wider spread than 0.8-1.5x says the model no longer explains the data"
    model = predict.HOST_MODEL
    for label, pass_, host_us, calls, launches, scalars in predict.HOST_PAIRS_H100:
        point = model["per_call_us"] * calls + model["per_launch_us"] * launches + model["per_scalar_us"] * scalars
        assert point * low <= host_us <= point * high, (label, pass_, host_us, point)


def test_the_h100_pairs_counts_are_the_instruments():
    """The counts written into HOST_PAIRS_H100 are host_overhead's at the measured code (98b8efe) as far as the code
    since can tell: the same launches, and calls and wrapped scalars the pairs' or fewer (a replay's launches wrap
    none since `CudaDevice.launch_prepare`)."""
    for label, pass_, _, calls, launches, scalars in predict.HOST_PAIRS_H100:
        case = cases.select([label], ("gpu",))[0]
        counts = host_overhead.counts(case, pass_ != "fwd")
        assert counts["launches"] == launches and counts["calls"] <= calls, (label, pass_, counts)
        assert counts["scalars"] <= scalars, (label, pass_, counts)


# Launches the code has shed since the pairs were measured, per (case, pass): the tensor-core passes' channels-last
# copies in one launch (channels_last_copies: 3 -> 2 forward, 6 -> 3 backward), and the weight gradient's split-K
# summed in its kernel (conv_bwd_weight_igemm_finish gone: 1 backward, r50-64's; p-seed's tail of sums is over
# WG_FINISH_BYTES, so it keeps the final pass).
LAUNCHES_SHED = {("r50-64-gpu16", "fwd"): 1, ("r50-64-gpu16", "fwd+bwd"): 4, ("p-seed-gpu16", "fwd"): 1,
                 ("p-seed-gpu16", "fwd+bwd"): 3}


def test_the_pairs_counts_are_the_instruments_on_the_measured_plan():
    """The counts written into HOST_PAIRS are host_overhead's, under the plan the H200 run autotuned (r50-64-gpu32:
    im2col + cuBLAS, 3 launches forward as CUPTI saw).  The CuPy path moves on (other branches cut its calls); this
    checks the launches, which only a change of plan or a launch merged since (`LAUNCHES_SHED`) moves, and that the
    calls stay the pairs' or fall."""
    for label, pass_, _, choices, calls, launches in predict.HOST_PAIRS:
        case = cases.select([label], ("gpu",))[0]
        counts = host_overhead.counts(case, pass_ != "fwd", choices)
        shed = LAUNCHES_SHED.get((label, pass_), 0)
        assert counts["launches"] == launches - shed and counts["calls"] <= calls, (label, pass_, counts)


def test_a_slower_glue_raises_the_prediction(monkeypatch):
    """Monkeypatched extra work in the glue -- 40 more Python calls per kernel launch -- raises the predicted host
    time by 40 calls' worth per launch; and the iii forward's prediction stays host-bound."""
    from cupyconv import _device
    case = cases.select(["r50-64-gpu16"], ("gpu",))[0]
    before = predict.host_prediction(case, False)
    original = _device.CudaDevice.launch_run   # a repeated call's launches are prepared

    def busy():
        return None

    def slow_launch(self, *args, **kwargs):
        for _ in range(40):
            busy()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_device.CudaDevice, "launch_run", slow_launch)
    after = predict.host_prediction(case, False)
    kernels = after["host_counts"]["launches"]   # all three are raw kernels here (no cuBLAS, no array work)
    assert after["host_counts"]["calls"] == pytest.approx(before["host_counts"]["calls"] + kernels * 41, abs=0.2)
    rise = predict.HOST_MODEL["per_call_us"] * kernels * 41
    low, high = predict.HOST_MODEL["spread"]
    assert after["host_us"][0] == pytest.approx(before["host_us"][0] + rise * low, abs=0.2)
    assert after["host_us"][1] > before["host_us"][1]


def test_scalars_wrapped_on_every_launch_raise_the_prediction(monkeypatch):
    """Unprepared scalars (CuPy wrapping each on every launch, as before `CudaDevice.launch_prepare`) are counted and
    priced: r50-64 fp16's forward passes 75 (51 to channels_last_copies, 24 to conv_fwd_igemm)."""
    from cupyconv import _device
    case = cases.select(["r50-64-gpu16"], ("gpu",))[0]
    before = predict.host_prediction(case, False)
    assert before["host_counts"]["scalars"] == 0
    monkeypatch.setattr(_device, "_packed", tuple)
    after = predict.host_prediction(case, False)
    assert after["host_counts"]["scalars"] == 75
    low, _ = predict.HOST_MODEL["spread"]
    rise = predict.HOST_MODEL["per_scalar_us"] * 75 * low
    assert after["host_us"][0] == pytest.approx(before["host_us"][0] + rise, abs=0.2)
