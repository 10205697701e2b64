"""benchmarks/gpu_check.py, the one command of a GPU lease, keeps working where no GPU is: its --dry-run collects
the GPU tests and the sanitizer selection, runs the large-case checks on tiny shapes and the benchmark smoke, and
writes the same files a GPU run writes, within what a device run can bring back (8 files, 2 folders deep)."""
import json
import os
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
    from benchmarks.gpu_check import OUTPUT_FILES, SANITIZER_TESTS, STEPS
    out = tmp_path / "check"
    result = _gpu_check("--dry-run", "--out", out)
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


def test_calibration_puts_predicted_next_to_measured(tmp_path):
    """The model's error on a run: each measured case-pass next to the predictions of record, in summary.md's
    table and in bench.json's results."""
    from benchmarks import gpu_check, predict
    predictions = json.loads(predict.PREDICTIONS["h100"].read_text())
    low, high = next(r["predicted_us"] for r in predictions["results"]
                     if (r["case"], r["pass"]) == ("r50-64-gpu16", "fwd"))
    measured_ms = 2 * high / 1e3          # twice the top of the range: outside it
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
    assert row["measured_us"] == pytest.approx(2 * high) and not row["inside"]
    assert row["measured_over_predicted"] == pytest.approx([2 * high / low, 2.0], rel=1e-3)
    written = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert written[0]["prediction"]["predicted_us"] == [low, high] and "prediction" not in written[1]
    text = "\n".join(gpu_check.summary_calibration(check, record))
    assert "0 of 1 measurements inside the predicted range" in text and "**outside**" in text
    (tmp_path / "env.json").write_text(json.dumps({"cupy_device": {"name": "NVIDIA A100-SXM4-80GB"}}))
    assert "no constants for 'NVIDIA A100" in gpu_check.calibrate(check)["status"]


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
