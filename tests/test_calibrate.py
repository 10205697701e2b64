"""benchmarks/calibrate.py matches each kernel of a measured host profile (CUPTI names) with the model's predicted
launches of the same case-pass: checked on the committed H200 profiles and the predictions of record they were
measured against (kept beside them, frozen: the predictions of record move with the model and the kernels),
kernel by kernel, against matches written out here by hand from the two files."""
import json
from pathlib import Path

import pytest

from benchmarks import calibrate, predict

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "benchmarks" / "results" / "gpu-2026-11-26" / "host-profile"
PREDICTIONS = ROOT / "benchmarks" / "results" / "gpu-2026-11-26" / "predict-h200-of-record.json"


@pytest.fixture(scope="module")
def rows():
    predictions = json.loads(PREDICTIONS.read_text())
    profiles = {p.stem: calibrate.load_profile(p) for p in sorted(PROFILES.glob("autotune-*.json"))}
    return calibrate.calibrate(profiles, predictions)


def _case(rows, profile, case, pass_):
    return [r for r in rows if (r["profile"], r["case"], r["pass"]) == (profile, case, pass_)]


@pytest.mark.parametrize("name, base", [
    ("void depthwise_fwd<float, int, 3, 1, false, true>(float const*, float const*, float const*", "depthwise_fwd"),
    ("depthwise_fwd<__half, int, 3, 1, true>", "depthwise_fwd"),
    ("void conv_bwd_weight_igemm_finish<__half, int>(float const*, float const*, __half*, __half",
     "conv_bwd_weight_igemm_finish"),
    ("cupy_copy__float32_float32", "CuPy copy"), ("CuPy copy", "CuPy copy"), ("cupy_sum", "CuPy sum"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_al", "cuBLAS gemm"),
    ("cuBLAS gemmStridedBatchedEx", "cuBLAS gemm"),
    ("void unfold_im2col<float, int, 4>(float const*, float*, int, int", "unfold_im2col"),
])
def test_kernel_base_names_both_sides_alike(name, base):
    assert calibrate.kernel_base(name) == base


def test_r50_64_fp16_forward_matches_one_igemm_and_two_copies(rows):
    got = _case(rows, "autotune-off", "r50-64-gpu16", "fwd")
    assert [(r["kernel"], r["launches"], r["predicted_launches"]) for r in got] == [
        ("channels_last_copy", 2, 2), ("conv_fwd_igemm", 1, 1)]
    copies, igemm = got
    # the two predicted copies of record: 7.32-10.69 (x) and 1.69-4.53 (the weight), summed
    assert copies["predicted_us"] == pytest.approx([7.32 + 1.69, 10.69 + 4.53])
    assert copies["measured_us"] == pytest.approx(8.5888, abs=1e-3)
    assert igemm["predicted_us"] == pytest.approx([30.02, 42.89])
    assert igemm["inside"] and igemm["measured_over_high"] == pytest.approx(38.272 / 42.89, abs=1e-3)


def test_every_measured_kernel_is_matched_or_named_unpredicted(rows):
    """Whole table, by hand from the two JSON files: (profile, case, pass, kernel) -> (launches measured, launches
    predicted for them); predicted launches nothing measured are the rows with 0 measured."""
    expected = {
        ("autotune-off", "r50-64-gpu16", "fwd+bwd"): [("channels_last_copy", 5, 5), ("conv_fwd_igemm", 2, 2),
                                                       ("conv_bwd_weight_igemm", 1, 1),
                                                       ("conv_bwd_weight_igemm_finish", 1, 1)],
        ("autotune-off", "iii-gpu32", "fwd+bwd"): [("depthwise_fwd", 1, 1), ("depthwise_bwd_input", 1, 1),
                                                   ("depthwise_bwd_weight", 1, 1), ("depthwise_bwd_reduce", 1, 1)],
        # autotune on timed the host and ran conv_fwd_direct, which the 'auto' plan of record does not launch
        ("autotune-on", "r50-64-gpu16", "fwd"): [("conv_fwd_direct", 1, 0), ("channels_last_copy", 0, 1),
                                                 ("channels_last_copy", 0, 1), ("conv_fwd_igemm", 0, 1)],
        ("autotune-on", "p-seed-gpu16", "fwd+bwd"): [("channels_last_copy", 5, 5), ("conv_fwd_igemm", 1, 1),
                                                     ("conv_fwd_igemm", 1, 1), ("conv_bwd_weight_igemm", 1, 1),
                                                     ("conv_bwd_weight_igemm_finish", 1, 1)],
        ("autotune-on", "dw-480-14-gpu16", "fwd"): [("depthwise_fwd", 1, 1)],
        ("autotune-on", "iv-gpu16", "fwd+bwd"): [("unfold_im2col", 1, 1), ("fold_col2im", 1, 1)],
        ("autotune-on", "r50-64-gpu32", "fwd"): [("CuPy copy", 1, 1), ("simt_fwd", 1, 1)],
        ("autotune-on", "r50-64-gpu32", "fwd+bwd"): [
            ("CuPy copy", 3, 3), ("simt_fwd", 2, 2), ("unfold_im2col", 1, 0), ("cuBLAS gemm", 1, 0),
            ("conv_bgrad", 1, 0), ("CuPy copy", 0, 1), ("simt_bwd_weight", 0, 1), ("CuPy sum", 0, 1)],
    }
    for (profile, case, pass_), want in expected.items():
        got = [(r["kernel"], r["launches"], r["predicted_launches"]) for r in _case(rows, profile, case, pass_)]
        assert got == want, (profile, case, pass_)
    # the profiles hold 6 + 12 case-passes and every one has a prediction of record
    assert len({(r["profile"], r["case"], r["pass"]) for r in rows}) == 16
    assert not [r for r in rows if "error" in r]
    for r in rows:
        if r["launches"] and r["predicted_launches"] == r["launches"]:
            assert r["inside"] is not None and r["predicted_us"][0] <= r["predicted_us"][1]
        elif r["launches"]:
            assert r.get("unpredicted_launches") == r["launches"] - r["predicted_launches"]


def test_the_second_conv_fwd_igemm_takes_the_second_prediction(rows):
    """Two measured names of one base (p-seed's forward 256x64 and its input gradient 256x32) take the predicted
    launches in order: the first the forward's 37.5-75.9, the second the input gradient's 66.5-80.0."""
    igemm = [r for r in _case(rows, "autotune-on", "p-seed-gpu16", "fwd+bwd") if r["kernel"] == "conv_fwd_igemm"]
    assert [r["predicted_names"] for r in igemm] == [["conv_fwd_igemm<__half, int, 256, 64, 4>"],
                                                      ["conv_fwd_igemm<__half, int, 256, 32, 4>"]]
    assert igemm[1]["predicted_us"] == pytest.approx([66.47, 79.97])


def test_kernel_us_is_compared_where_a_prediction_gives_it():
    predicted = [{"name": "k<float>", "bound": "DRAM", "predicted_us": [3.0, 6.0], "kernel_us": [2.0, 4.0]}]
    (row,) = calibrate.match_case_pass({"void k<float, int>(float const*": [1.0, 5.0]}, predicted)
    assert row["predicted_us"] == [2.0, 4.0] and row["inside"] is False and row["measured_over_high"] == 1.25


def test_summary_per_bound_class(rows):
    classes = {c["bound"]: c for c in calibrate.summary(rows)}
    issue = classes["instruction issue"]
    assert issue["rows"] == issue["inside"] + issue["above"] + issue["below"]
    assert issue["above"] >= 5   # the finding of 2026-11-26: issue-bound kernels at or above their high end
    assert classes["launch overhead"]["below"] == classes["launch overhead"]["rows"]
    assert "| conv_bgrad | 1 | 159.8 | no prediction" in calibrate.markdown(rows, calibrate.summary(rows))


def test_command_line(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert calibrate.main([str(PROFILES / "autotune-off.json"), "--predictions", str(PREDICTIONS),
                           "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MEASURED" in text and "PREDICTED" in text and "| conv_fwd_igemm | 1 | 38.3 | 30.0-42.9 |" in text
    assert json.loads(out.read_text())["rows"]


# The model against the H100's MEASURED kernel times (benchmarks/results/gpu-2026-11-26-h100: bench.json["profile"],
# CUPTI, autotune off, commit 98b8efe): each profiled launch's recorded work (model-inputs.json, the SASS's and the
# emulator's counts at that commit) re-timed by today's rules.  Every measured kernel must fall inside its predicted
# range but these, which the model still misses (named, so that fixing one, or losing another, fails here):
H100_MISSES = {
    ("p-seed-gpu16", "fwd", "channels_last_copies"): "above",    # 19.9 us against 10.4-17.7
}
# (r50-64-gpu32's simt_bwd_weight, 263.9 us against 145.6-225.5 at the run, is inside since task calib's
# `simt_in_sequence_high`: 145.6-321.5)


def _h100_rows():
    inputs = json.loads(calibrate.H100_INPUTS.read_text())
    profile = calibrate.load_profile(calibrate.H100_RUN / "bench.json")
    return calibrate.calibrate({"h100": profile}, calibrate.retimed(inputs))


def _misses(rows):
    return {(r["case"], r["pass"], r["kernel"]): "above" if r["measured_us"] > r["predicted_us"][1] else "below"
            for r in rows if r.get("inside") is False}


def test_the_model_brackets_the_h100s_measured_kernel_times():
    rows = _h100_rows()
    assert len(rows) == 41 and not [r for r in rows if "error" in r or r.get("not_measured")]
    assert all(r["inside"] is not None for r in rows)
    assert _misses(rows) == H100_MISSES
    # the four the model missed at the run (issue 25, task dwmodel), now inside
    got = {(r["case"], r["kernel"]): r["predicted_us"] for r in rows if r["pass"] == "fwd+bwd"}
    assert got[("dw-672-14k5-gpu32", "depthwise_bwd_weight")] == pytest.approx([78.31, 236.92], abs=0.01)
    assert got[("dw-480-14-gpu16", "depthwise_bwd_weight")] == pytest.approx([17.94, 66.96], abs=0.01)


def test_the_h100_check_fails_under_the_model_before_dwmodel(monkeypatch):
    """The check can fail: with the rules of before (waits hidden under a multi-trip warp's instructions, memory
    alone at a memory-bound one-pass kernel's high end, every written byte through DRAM) the six misses of the run
    come back."""
    monkeypatch.setattr(predict, "in_turns", predict.one_pass)
    monkeypatch.setattr(predict, "in_lockstep", lambda *args: False)
    monkeypatch.setattr(predict, "dram_low_bytes", lambda work, gpu: work["compulsory_bytes"])
    rows = _h100_rows()
    assert _misses(rows) == {**H100_MISSES, ("iii-gpu32", "fwd+bwd", "depthwise_bwd_input"): "above",
                             ("iv-gpu16", "fwd", "unfold_im2col"): "below",
                             ("iv-gpu16", "fwd+bwd", "unfold_im2col"): "below",
                             ("dw-480-14-gpu16", "fwd+bwd", "depthwise_bwd_weight"): "above",
                             ("dw-672-14k5-gpu32", "fwd+bwd", "depthwise_bwd_weight"): "above",
                             ("iv-gpu16", "fwd+bwd", "fold_col2im"): "above"}
    got = {(r["case"], r["kernel"]): r["predicted_us"] for r in rows if r["pass"] == "fwd+bwd"}
    # the figures of the run's summary.md (the model at 98b8efe)
    assert got[("dw-672-14k5-gpu32", "depthwise_bwd_weight")] == pytest.approx([49.6, 121.7], abs=0.05)
    assert got[("iv-gpu16", "fold_col2im")] == pytest.approx([11.4, 17.0], abs=0.05)


def test_the_model_brackets_the_h200s_unfold_and_fold():
    """The H200's run (benchmarks/results/gpu-2026-11-26/after-fixes, commit 21e92e1) launched the same unfold.cu
    kernels with the same plans (neither raw_kernels/unfold.cu nor cupyconv/ops/unfold.py changed up to 98b8efe),
    so the H100's recorded work re-timed for the H200 stands for them: fold_col2im took 19.2 us there, above the
    model before (8.3-12.5), inside it now."""
    inputs = json.loads(calibrate.H100_INPUTS.read_text())
    inputs = {"gpu": "h200", "results": [r for r in inputs["results"] if r["case"] == "iv-gpu16"]}
    profile = calibrate.load_profile(ROOT / "benchmarks" / "results" / "gpu-2026-11-26" / "after-fixes" /
                                     "host_profile.json")
    profile = {k: v for k, v in profile.items() if k.startswith("iv-gpu16-")}
    rows = calibrate.calibrate({"h200": profile}, calibrate.retimed(inputs))
    assert [(r["kernel"], r["inside"]) for r in rows] == [("unfold_im2col", True), ("unfold_im2col", True),
                                                           ("fold_col2im", True)]


def test_model_inputs_command_line(tmp_path, monkeypatch):
    """--model-inputs OUT records the first profile's case-passes (`model_inputs`, slow: stubbed here) into OUT."""
    seen = []
    monkeypatch.setattr(calibrate, "model_inputs", lambda profile: seen.append(sorted(profile)) or {"gpu": "h100"})
    out = tmp_path / "inputs.json"
    assert calibrate.main([str(calibrate.H100_RUN / "bench.json"), "--model-inputs", str(out)]) == 0
    assert json.loads(out.read_text()) == {"gpu": "h100"} and len(seen[0]) == 16
