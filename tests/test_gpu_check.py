"""benchmarks/gpu_check.py, the one command of a GPU lease, keeps working where no GPU is: its --dry-run collects
the GPU tests and the sanitizer selection, runs the large-case checks on tiny shapes and the benchmark smoke, and
writes the same files a GPU run writes, within what a device run can bring back (8 files, 2 folders deep)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_dry_run_writes_the_files_of_a_gpu_run(tmp_path):
    from benchmarks.gpu_check import DEFAULT_BUDGET_S, OUTPUT_FILES, SANITIZER_TESTS, STEPS
    out = tmp_path / "check"
    # Twice the default budget, so every step's limit doubles: the dry run's steps run the emulator, whose time on a
    # shared two-core machine says nothing of a GPU's, and its "large" step took 69 s of its 80 on an idle CI machine
    # (over 80 under load, a cold emulator cache building depthwise.cu).  The GPU run keeps the default.
    result = _gpu_check("--dry-run", "--out", out, "--budget", 2 * DEFAULT_BUDGET_S, timeout=600)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-6000:]}\nstderr:\n{result.stderr[-3000:]}"

    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(f.parts) <= 2 for f in files), files
    assert sorted(str(f) for f in files) == sorted(OUTPUT_FILES)

    summary = (out / "summary.md").read_text()
    assert result.stdout.endswith(summary), "the summary is printed last"
    for step in STEPS:
        assert f"| {step} | ok |" in summary, summary
    assert "nothing ran on a GPU" in summary
    assert f"Collected {len(SANITIZER_TESTS)} of the selection" in summary

    large = json.loads((out / "large.json").read_text())
    assert large["complete"] and {c["op"] for c in large["checks"]} == {"conv2d", "depthwise", "patch", "unfold"}
    assert all(c["ok"] and c["samples"] > 0 and c["nonfinite"] == 0 for c in large["checks"]), large["checks"]
    env = json.loads((out / "env.json").read_text())
    assert env["dry_run"] and env["meta"]["numpy"]
    bench = json.loads((out / "bench.json").read_text())
    assert bench["mode"] == "smoke" and bench["results"]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plotted in bench.png" in summary
    assert "===== the sanitizer selection" in (out / "pytest.log").read_text(), "the sanitizer's part of the log"
    assert "## Model calibration" in summary and "the ratios below mean nothing" in summary
    assert any("prediction" in r for r in bench["results"]), "predicted next to measured in bench.json"
    # the profile step (host_profile --dry-run: recorded kernels, 0 us) folded into bench.json, and its kernels
    # matched with every predicted launch of the profiled cases in summary.md's kernel table
    from benchmarks.gpu_check import PROFILE_CASES
    profile = bench["profile"]
    assert set(profile) == {f"{c}-{p}" for c in PROFILE_CASES for p in ("fwd", "fwdbwd")}
    assert all(r.get("dry_run") and r["kernels"] for r in profile.values()), profile
    # (r50-64's 16-bit forward runs on conv_fwd_wgmma on a 9.0 GPU, as on the dry run's emulated one: task wgmma)
    assert "### Kernels: MEASURED GPU time" in summary and "| profile | r50-64-gpu16 | fwd | conv_fwd_wgmma | 1 |" \
        in summary and "no prediction" not in summary and "(predicted, not measured)" not in summary
    assert "MEASURED wall us (host + GPU)" in summary
    # ... and again with autotuning on for a few cases, apart from the calibration's profile, with its picks (none on
    # the NumPy path of a dry run) and a table of its figures next to the autotune-off ones
    from benchmarks.gpu_check import PROFILE_AUTOTUNE_CASES
    assert set(bench["profile_autotune"]) == {f"{c}-{p}" for c in PROFILE_AUTOTUNE_CASES for p in ("fwd", "fwdbwd")}
    assert all(r.get("dry_run") and r["autotune_picks"] == [] for r in bench["profile_autotune"].values())
    assert bench["profile_settings"]["autotune_on_cases"] == list(PROFILE_AUTOTUNE_CASES)
    assert "host_profile, autotuning off -> on" in summary and "| r50-64-gpu16-fwd |" in summary
    # the benchmark's own timer on the profiled calls, alone and interleaved, for the benchmark-vs-profile gap
    assert "The benchmark's timer (CUDA events around 20 queued calls)" in summary
    assert all(r["benchmark_timer"]["alone_us"] > 0 for r in profile.values())


def test_calibration_puts_predicted_next_to_measured(tmp_path):
    """The model's error on a run: each measured case-pass next to the predictions of record, in summary.md's
    table and in bench.json's results."""
    from benchmarks import gpu_check, predict
    predictions = json.loads(predict.PREDICTIONS["h100"].read_text())
    of_record = next(r for r in predictions["results"] if (r["case"], r["pass"]) == ("r50-64-gpu16", "fwd"))
    low, high = of_record["predicted_us"]
    top = of_record.get("wall_us", [low, high])[1]   # the wall range's top (the GPU's, before the host model)
    measured_ms = 2 * top / 1e3           # twice the top of the range: outside it
    bench = {"results": [
        {"case": "r50-64-gpu16", "pass": "fwd", "contenders": {"cupyconv": {"status": "ok", "median_ms": measured_ms}}},
        {"case": "r50-64-gpu16", "pass": "fwd+bwd", "contenders": {"cupyconv": {"status": "error: x"}}},
        {"case": "not-a-case", "pass": "fwd", "contenders": {"cupyconv": {"status": "ok", "median_ms": 1.0}}}]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "env.json").write_text(json.dumps({"cupy_device": {"name": "NVIDIA H100 80GB HBM3"}}))
    check = gpu_check.Check(tmp_path, False, 540, 0.0)
    record = gpu_check.calibrate(check)
    assert record["status"] == "ok" and record["gpu"] == "h100" and len(record["rows"]) == 1
    row = record["rows"][0]
    assert row["measured_us"] == pytest.approx(2 * top) and not row["inside"]
    assert row["measured_over_predicted"] == pytest.approx([2 * top / low, 2 * top / high], rel=1e-3)
    written = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert written[0]["prediction"]["predicted_us"] == [low, high] and "prediction" not in written[1]
    text = "\n".join(gpu_check.summary_calibration(check, record))
    assert "0 of 1 measurements inside the predicted wall range" in text and "**outside**" in text
    # predictions without host_us: the wall range is the GPU's, and the summary says so
    assert ("have no host model" in text) == ("host_us" not in of_record)
    (tmp_path / "env.json").write_text(json.dumps({"cupy_device": {"name": "NVIDIA A100-SXM4-80GB"}}))
    assert "no constants for 'NVIDIA A100" in gpu_check.calibrate(check)["status"]


def test_calibration_compares_the_measured_wall_time_with_the_predicted_wall(tmp_path):
    """With the host model, a host-bound case-pass's measured wall time is compared with max(GPU, host): 79 us
    measured against 5-8 us of kernels is outside the GPU range but inside a 70-110 us wall range."""
    from benchmarks import gpu_check, predict
    prediction = {"case": "iii-gpu32", "pass": "fwd", "predicted_us": [5.0, 8.0], "host_us": [70.0, 110.0],
                  "wall_us": [70.0, 110.0], "host_bound": True, "bound": "issue (depthwise_fwd)", "floor_us": 2.7}
    bench = {"results": [{"case": "iii-gpu32", "pass": "fwd",
                          "contenders": {"cupyconv": {"status": "ok", "median_ms": 0.079}}}]}
    rows = predict.calibration(bench, {"results": [prediction]})
    assert len(rows) == 1 and not rows[0]["inside"] and rows[0]["inside_wall"] and rows[0]["bound"] == "host"
    assert rows[0]["measured_over_wall"] == pytest.approx([79 / 70, 79 / 110], rel=1e-3)
    record = {"status": "ok", "gpu": "h200", "rows": rows, "kernel_rows": [], "stale": False, "meta": {}}
    text = "\n".join(gpu_check.summary_calibration(gpu_check.Check(tmp_path, False, 540, 0.0), record))
    assert "1 of 1 measurements inside the predicted wall range" in text and "have no host model" not in text
    assert "| iii-gpu32 | fwd | 79.0 | 5-8 | 70-110 | 70-110 | 0.72-1.13 | host |" in text, text


def test_calibration_of_kernels_from_the_profile_step(tmp_path):
    """The profile step's JSON (here the H200's measured autotune-off profile) goes into bench.json under "profile"
    and its kernels into the summary's kernel table, matched with the H200 predictions of record; without a
    bench.json the profile goes to run.log and the kernel table is still made."""
    from benchmarks import gpu_check, predict
    measured = ROOT / "benchmarks" / "results" / "gpu-2026-11-26" / "host-profile" / "autotune-off.json"
    check = gpu_check.Check(tmp_path, False, 540, 0.0)
    (tmp_path / "env.json").write_text(json.dumps({"cupy_device": {"name": "NVIDIA H200"}}))
    gpu_check.profile_json(check).write_text(measured.read_text())
    (tmp_path / "bench.json").write_text(json.dumps({"results": []}))
    record = gpu_check.calibrate(check)
    assert record["status"] == "ok" and record["gpu"] == "h200"
    assert not gpu_check.profile_json(check).exists(), "the temporary JSON is removed once folded in"
    assert json.loads((tmp_path / "bench.json").read_text())["profile"] == json.loads(measured.read_text())
    # (r50-64's forward measured conv_fwd_igemm; the predictions of record model it on conv_fwd_wgmma, opted in on a
    # 9.0 GPU, so its weight gradient is the kernel both have)
    wgrad = [r for r in record["kernel_rows"] if (r["case"], r["pass"], r["kernel"]) ==
             ("r50-64-gpu16", "fwd+bwd", "conv_bwd_weight_igemm")]
    assert len(wgrad) == 1 and wgrad[0]["measured_us"] == pytest.approx(39.9, abs=0.05)
    measured_us = wgrad[0]["measured_us"]
    text = "\n".join(gpu_check.summary_calibration(check, record))
    of_record = next(k for r in json.loads(predict.PREDICTIONS["h200"].read_text())["results"]
                     if (r["case"], r["pass"]) == ("r50-64-gpu16", "fwd+bwd") for k in r["kernels"]
                     if k["name"].startswith("conv_bwd_weight_igemm<"))
    low, high = of_record.get("kernel_us", of_record["predicted_us"])   # the kernel's own time where given
    assert (f"| profile | r50-64-gpu16 | fwd+bwd | conv_bwd_weight_igemm | 1 | {measured_us:.1f} | {low:.1f}-{high:.1f} |"
            in text)
    assert "| profile | r50-64-gpu16 | fwd | conv_fwd_igemm | 1 | 38.3 | no prediction" in text
    assert re.search(r"\| profile \| iii-gpu32 \| fwd\+bwd \| depthwise_bwd_reduce( \(one pass\))? \| 1 \| 1\.2 \|", text)
    (tmp_path / "bench.json").unlink()
    gpu_check.profile_json(check).write_text(measured.read_text())
    record = gpu_check.calibrate(check)
    assert record["kernel_rows"] and record.get("no_bench")
    assert "host_profile (autotune off" in (tmp_path / "run.log").read_text()
    assert "No bench.json." in "\n".join(gpu_check.summary_calibration(check, record))


def test_bad_arguments_get_a_clear_error(tmp_path):
    a_file = tmp_path / "results.json"
    a_file.write_text("{}")
    result = _gpu_check("--out", a_file)
    assert result.returncode == 2 and "is a file" in result.stderr
    (tmp_path / "notes.txt").write_text("mine")
    result = _gpu_check("--dry-run", "--out", tmp_path)
    assert result.returncode == 2 and "holds other files (notes.txt" in result.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"
    result = _gpu_check("--dry-run", "--out", tmp_path / "new", "--steps", "env,benchmarks")
    assert result.returncode == 2 and "--steps: benchmarks" in result.stderr
    result = _gpu_check("--out", tmp_path / "new", "--budget", "5")
    assert result.returncode == 2 and "--budget 5" in result.stderr
    assert not (tmp_path / "new").exists()


def test_selected_reads_the_gpu_selection_of_a_run():
    from benchmarks.gpu_check import selected
    assert selected("platform linux\ncollected 2937 items / 2590 deselected / 347 selected\n\n") == 347
    assert selected("collected 12 items\n") == 12
    assert selected("347/2937 tests collected (2590 deselected) in 18.49s") == 347
    assert selected("ImportError while loading conftest") is None


@pytest.mark.parametrize("run, expected, counts, gpu, status", [
    # a GPU machine where the probe failed: everything skipped, pytest exits 0; the step must fail
    ({"rc": 0, "timed_out": False}, 347, {"tests": 347, "failures": 0, "errors": 0, "skipped": 347}, True,
     "failed: GPU present, but only 0 of the 347 collected GPU tests ran (347 skipped)"),
    ({"rc": 0, "timed_out": False}, 347, {"tests": 347, "failures": 0, "errors": 0, "skipped": 2}, True,
     "failed: GPU present, but only 345 of the 347 collected GPU tests ran (2 skipped)"),
    ({"rc": 0, "timed_out": False}, 347, {"tests": 347, "failures": 0, "errors": 0, "skipped": 0}, True, "ok"),
    # one machine, one GPU: the two-GPU test may skip
    ({"rc": 0, "timed_out": False}, 347, {"tests": 347, "failures": 0, "errors": 0, "skipped": 1,
                                          "hardware_skips": 1}, True, "ok"),
    ({"rc": 0, "timed_out": False}, None, None, True,
     "failed: GPU present, but the number of GPU tests collected or run is unknown (see pytest.log)"),
    # no GPU on the machine: skipping is all the suite can do
    ({"rc": 0, "timed_out": False}, 347, {"tests": 347, "failures": 0, "errors": 0, "skipped": 347}, False, "ok"),
    ({"rc": 1, "timed_out": False}, 347, {"tests": 347, "failures": 3, "errors": 0, "skipped": 0}, True, "failed"),
    ({"rc": -2, "timed_out": True}, 347, None, True, "timed out"),
])
def test_pytest_step_fails_when_a_gpu_machine_skips(run, expected, counts, gpu, status):
    from benchmarks.gpu_check import judge_pytest
    assert judge_pytest(run, expected, counts, gpu) == status


def test_gpu_presence_is_asked_of_the_driver_not_of_cupy(monkeypatch, tmp_path):
    """Fakes: no /proc/driver/nvidia entry, and an `nvidia-smi` on PATH that lists one GPU or none."""
    import benchmarks.gpu_check as gpu_check
    monkeypatch.setattr(gpu_check, "Path", lambda p: tmp_path / "no-such-dir" if p.startswith("/proc") else Path(p))
    smi = tmp_path / "nvidia-smi"
    for listing, present in (("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)", True),
                             ("No devices were found", False)):
        smi.write_text(f"#!/bin/sh\necho '{listing}'\n")
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        assert gpu_check.gpu_present() is present
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_check.gpu_present() is False


def test_precompile_step_lists_the_kernels_in_a_dry_run(tmp_path):
    import time
    from benchmarks.gpu_check import Check, step_precompile
    from cupyconv import _device
    record = step_precompile(Check(tmp_path, True, 540, time.perf_counter()), 60)
    assert record["status"] == "ok" and record["kernels"] == len(_device.all_instantiations()), record
    assert "cupyconv.precompile --dry-run" in (tmp_path / "run.log").read_text()


def test_pytest_counts_reads_the_junit_xml(tmp_path):
    from benchmarks.gpu_check import pytest_counts
    xml = tmp_path / "pytest.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="2">'
                   '<testcase classname="a" name="x"/>'
                   '<testcase classname="a" name="y"><skipped message="needs two CUDA GPUs"/></testcase>'
                   '<testcase classname="a" name="z"><skipped message="needs CuPy and a CUDA GPU: CuPy sees 0 CUDA '
                   'devices"/></testcase></testsuite></testsuites>')
    assert pytest_counts(xml) == {"tests": 3, "failures": 0, "errors": 0, "skipped": 2, "hardware_skips": 1}
    assert pytest_counts(tmp_path / "missing.xml") is None


def test_bench_order_puts_the_cases_no_gpu_has_measured_first(tmp_path):
    """A lease's benchmark step reaches only part of the GPU cases: those no earlier run measured go first, the
    issue-11 ones first within each part, and every GPU case once."""
    from benchmarks import cases
    from benchmarks.gpu_check import bench_order, measured_labels
    gpu = [c.label for c in cases.select([], ("gpu",))]
    issue11 = {c.label for c in cases.select([], ("gpu",)) if "issue11" in c.tags}
    measured = {gpu[0], gpu[-1], *sorted(issue11)[:1]}
    order = bench_order(measured)
    assert sorted(order) == sorted(gpu)
    unmeasured = order[:len(gpu) - len(measured)]
    assert measured.isdisjoint(unmeasured) and set(order[len(unmeasured):]) == measured
    for part in (unmeasured, order[len(unmeasured):]):
        flags = [label in issue11 for label in part]
        assert flags == sorted(flags, reverse=True), part
    run = tmp_path / "gpu-x"
    run.mkdir()
    (run / "bench.json").write_text(json.dumps({"results": [{"case": gpu[3]}, {"case": gpu[3]}]}))
    (tmp_path / "gpu-broken").mkdir()
    (tmp_path / "gpu-broken" / "bench.json").write_text("{")
    assert measured_labels(tmp_path) == {gpu[3]}
    assert measured_labels() & set(gpu)   # the recorded runs of benchmarks/results


def test_summary_puts_autotuning_on_next_to_off():
    """summary.md's autotune tables: the benchmark's "cupyconv (autotune)" against "cupyconv" (the default) with the
    passes where autotuning kept another algorithm than the heuristic's, and host_profile's off -> on figures."""
    from benchmarks import gpu_check
    from benchmarks.cases import AUTOTUNE
    picks = [{"pass": "forward", "algorithm": "implicit_gemm", "heuristic": "implicit_gemm"},
             {"pass": "grad_weight", "algorithm": "im2col_gemm", "heuristic": "implicit_gemm"}]
    bench = {"results": [
        {"case": "r50-64-gpu16", "pass": "fwd+bwd", "contenders": {
            "cupyconv": {"median_ms": 0.26}, AUTOTUNE: {"median_ms": 0.39, "picks": picks}}},
        {"case": "r50-64-gpu16", "pass": "fwd", "contenders": {
            "cupyconv": {"median_ms": 0.133}, AUTOTUNE: {"median_ms": 0.133, "picks": "error: KeyError: x"}}},
        {"case": "iii-gpu32", "pass": "fwd", "contenders": {"cupyconv": {"median_ms": 0.04}}}],
        "profile": {"r50-64-gpu16-fwd": {"host_us": 129.8, "wall_us": 133.0, "kernel_us": 48.7}},
        "profile_autotune": {"r50-64-gpu16-fwd": {"host_us": 130.1, "wall_us": 133.4, "kernel_us": 48.6,
                                                  "autotune_picks": picks[:1]},
                             "r50-256-gpu16-fwd": {"error": "RuntimeError: boom"}}}
    text = "\n".join(gpu_check.summary_autotune(bench))
    assert "(2 case-passes, the 12 where it costs most)" in text
    rows = [line for line in text.splitlines() if line.startswith("| r50-")]
    assert rows[0] == ("| r50-64-gpu16 | fwd+bwd | 0.260 | 0.390 | 1.50 | grad_weight im2col_gemm (not implicit_gemm) |")
    assert rows[1] == "| r50-64-gpu16 | fwd | 0.133 | 0.133 | 1.00 | error: KeyError: x |"
    assert rows[2] == "| r50-64-gpu16-fwd | 129.8 -> 130.1 | 133.0 -> 133.4 | 48.7 -> 48.6 | - |"
    assert rows[3] == "| r50-256-gpu16-fwd | - -> - | - -> - | - -> - | RuntimeError: boom |"
    assert gpu_check.summary_autotune({"results": []}) == []
