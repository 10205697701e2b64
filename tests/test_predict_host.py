"""benchmarks.predict's host model: every case-pass gets a predicted host time from what benchmarks.host_overhead
counts on the CPU (Python function calls, launches, allocations and the scalar arguments CuPy wraps per call),
with constants fitted to each GPU machine's measured host times (H200, H100); its wall time is max(GPU, host),
since the H200 found every forward host-bound.  That every case-pass gets a host range is checked with the rest of
its prediction (tests/test_predict.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cupy")

from benchmarks import cases, host_overhead, predict  # noqa: E402

MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-2026-11-26" / "after-fixes"
MEASURED_H100 = MEASURED.parents[1] / "gpu-2026-11-26-h100"


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
    """The pairs' measured host times are those of the committed H200 profile; the constants written out in
    HOST_MODELS["h200"] are the fit of the pairs; and every measured host time falls inside its predicted range (the
    spread is the fit's own extremes, so this holds by construction -- what it guards is that a change to the
    constants or the formula that no longer fits the measurements fails here)."""
    measured = json.loads((MEASURED / "host_profile.json").read_text())
    for label, pass_, host_us, *_ in predict.HOST_PAIRS:
        key = f"{label}-{'fwd' if pass_ == 'fwd' else 'fwdbwd'}"
        assert host_us == pytest.approx(measured[key]["host_us"], abs=0.05), key
    assert len(predict.HOST_PAIRS) == len(measured) == 12
    _check_fit(predict.HOST_PAIRS, predict.HOST_MODELS["h200"], widest=1.5)


def test_the_calibration_reproduces_the_measured_h100_pairs():
    """The same for the H100 (98b8efe, autotune off): its pairs are every case-pass of the gpu_check profile
    (bench.json["profile"]) and of the second run in extra/, r50-64-gpu16 in both (101.4 and 129.8 us forward:
    the run-to-run spread, which the range must hold).  Its fit is wider (0.84-1.53x, c3d-mri fwd+bwd the high
    end): up to 1.6x is allowed, and every pair must sit inside its predicted range."""
    results = MEASURED_H100
    runs = [json.loads((results / "bench.json").read_text())["profile"],
            json.loads((results / "extra" / "host_profile-p8x8-c3d-r50.json").read_text())]
    keys = [f"{label}-{'fwd' if pass_ == 'fwd' else 'fwdbwd'}" for label, pass_, *_ in predict.HOST_PAIRS_H100]
    assert len(keys) == sum(len(run) for run in runs) == 22
    for (label, pass_, host_us, *_), key in zip(predict.HOST_PAIRS_H100, keys):
        assert any(key in run and host_us == pytest.approx(run[key]["host_us"], abs=0.05) for run in runs), key
    _check_fit(predict.HOST_PAIRS_H100, predict.HOST_MODELS["h100"], widest=1.6)
    # the two runs of r50-64-gpu16's forward, both inside the range of the counts they ran (checked above); the
    # code since prepares its launches (no scalars wrapped per call, 3 allocations instead of 5): lower now
    pair = [p for p in predict.HOST_PAIRS_H100 if p[:2] == ("r50-64-gpu16", "fwd")][0]
    then = predict.host_point(predict.HOST_MODELS["h100"], dict(zip(("calls", "launches", "allocations", "scalars"),
                                                                    pair[4:])))
    low, high = predict.HOST_MODELS["h100"]["spread"]
    assert then * low <= 101.4 and 129.8 <= then * high
    case = cases.select(["r50-64-gpu16"], ("gpu",))[0]
    assert predict.host_prediction(case, False, gpu_key="h100")["host_us"][1] < then * high


def _check_fit(pairs, model, widest):
    assert predict.fit_host(pairs) == model
    low, high = model["spread"]
    assert 0.8 <= low <= 1 <= high <= widest, "a wider spread says the model no longer explains the data"
    for label, pass_, host_us, _, *counts in pairs:
        point = predict.host_point(model, dict(zip(("calls", "launches", "allocations", "scalars"), counts)))
        assert point * low <= host_us <= point * high, (label, pass_, host_us, point)


# Launches the code has shed since the pairs were measured, per (case, pass): the tensor-core passes' channels-last
# copies in one launch (channels_last_copies: 3 -> 2 forward, 6 -> 3 backward), and the weight gradient's split-K
# summed in its kernel (conv_bwd_weight_igemm_finish gone: 1 backward, r50-64's; p-seed's tail of sums is over
# WG_FINISH_BYTES, so it keeps the final pass); and the 16-bit patch forward in one launch of patch_fwd_igemm, x read
# as it lies (task tcpatch: p-seed's forward 2 launches -> 1, in both passes); and its backward's channels-last copies
# (tasks patchdx and patchdw: both gradients read grad_output and x as they lie, so p-seed's backward has none); and
# the strict fp32 weight gradient's grad_weight and grad_bias, views of its splits' sum since task simtfp, not two
# copies out of an interleaved bias row (r50-64-gpu32's pair runs its weight gradient on simt_bwd_weight: 2); and
# the depthwise weight gradient's partial rows summed in its kernel (depthwise_bwd_reduce gone, task dwwg: 1 backward).
LAUNCHES_SHED = {("r50-64-gpu16", "fwd"): 1, ("r50-64-gpu16", "fwd+bwd"): 4, ("p-seed-gpu16", "fwd"): 2,
                 ("p-seed-gpu16", "fwd+bwd"): 5, ("r50-64-gpu32", "fwd+bwd"): 2, ("iii-gpu32", "fwd+bwd"): 1,
                 ("dw-480-14-gpu16", "fwd+bwd"): 1}
# Scalar arguments of plans changed since 98b8efe: p-seed's forward is one patch_fwd_igemm launch (14 scalars: 13 and
# task patchdx's `flipped`) where the measured plan's copies and conv_fwd_igemm had 75 (forward+backward 179 -> 117;
# -> 108 with the input gradient on patch_fwd_igemm too instead of conv_fwd_igemm, task patchdx; its weight gradient
# is patch_bwd_weight_igemm (14 scalars) where conv_bwd_weight_igemm had 19, task patchdw; with both, the backward
# stages no channels-last copies at all: 14 forward + 14 input gradient + 14 weight gradient + 10 its final pass = 52).
# On a 9.0 GPU r50-64's 16-bit forward (and stride-1 input gradient) run on conv_fwd_wgmma, 6 scalars fewer than
# conv_fwd_igemm (task wgmma): 75 -> 69, 169 -> 157.  The depthwise backward has no depthwise_bwd_reduce (its rows
# and elements; task dwwg): 47 -> 45.
SCALARS_NOW = {("p-seed-gpu16", "fwd"): 14, ("p-seed-gpu16", "fwd+bwd"): 52, ("r50-64-gpu16", "fwd"): 69,
               ("r50-64-gpu16", "fwd+bwd"): 157, ("iii-gpu32", "fwd+bwd"): 45}


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


def test_the_h100_pairs_counts_are_the_instruments_at_this_code(monkeypatch):
    """The H100's pairs were counted at the code they measured (98b8efe, whose counts these are): the code may shed
    calls, launches and allocations since (the pairs keep what was measured), never add to them -- a count above
    the pair's means the pairs were not counted on the measured plan, or the glue grew.  Their scalars are the
    launches' scalar arguments, which 98b8efe's fast path had CuPy wrap on every call: a replay wraps none since
    (`CudaDevice.launch_prepare`), so they are counted with replaying off, and must be the pair's."""
    for label, pass_, _, choices, calls, launches, allocations, scalars in predict.HOST_PAIRS_H100:
        case = cases.select([label], ("gpu",))[0]
        counts = host_overhead.counts(case, pass_ != "fwd", choices)
        assert counts["launches"] <= launches and counts["allocations"] <= allocations, (label, pass_, counts)
        assert counts["calls"] <= calls and counts["scalars"] == 0, (label, pass_, counts)
    monkeypatch.setenv("CUPYCONV_REPLAY", "0")
    for label, pass_, _, choices, _, _, _, scalars in predict.HOST_PAIRS_H100[:6]:
        case = cases.select([label], ("gpu",))[0]
        assert host_overhead.counts(case, pass_ != "fwd", choices)["scalars"] == SCALARS_NOW.get((label, pass_),
                                                                                               scalars), (label, pass_)


def test_a_slower_glue_raises_the_prediction(monkeypatch):
    """Monkeypatched extra work in the glue -- 40 more Python calls per kernel launch -- raises the predicted host
    time by 40 calls' worth per launch; and the iii forward's prediction stays host-bound."""
    from cupyconv import _device
    case = cases.select(["r50-64-gpu16"], ("gpu",))[0]
    before = predict.host_prediction(case, False, gpu_key="h200")   # the model with a price per Python call
    original = _device.CudaDevice.launch_run   # a repeated call's launches are prepared

    def busy():
        return None

    def slow_launch(self, *args, **kwargs):
        for _ in range(40):
            busy()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_device.CudaDevice, "launch_run", slow_launch)
    after = predict.host_prediction(case, False, gpu_key="h200")
    kernels = after["host_counts"]["launches"]   # all three are raw kernels here (no cuBLAS, no array work)
    assert after["host_counts"]["calls"] == pytest.approx(before["host_counts"]["calls"] + kernels * 41, abs=0.2)
    rise = predict.HOST_MODELS["h200"]["per_call_us"] * kernels * 41
    low, high = predict.HOST_MODELS["h200"]["spread"]
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
    low, _ = predict.HOST_MODELS["h100"]["spread"]
    rise = predict.HOST_MODELS["h100"]["per_scalar_us"] * 75 * low
    assert after["host_us"][0] == pytest.approx(before["host_us"][0] + rise, abs=0.2)
