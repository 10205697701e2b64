"""The benchmark commands' own behaviour (no timing is checked): every command answers --help, report turns a bad
file into a one-line error, a run shows its progress on stderr."""
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) leaves the checkout off the path
    sys.path.append(str(ROOT))

from benchmarks import gpu_check, report, run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.parametrize("module", [run, report, gpu_check], ids=lambda m: m.__name__)
def test_help(module, capsys):
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {module.__name__}"), out


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ('{"results": []}', "not the JSON of `python -m benchmarks.run --json`"),
], ids=["missing", "not-json", "other-json"])
def test_report_on_a_bad_file_is_a_clean_error(tmp_path, capsys, content, message):
    path = tmp_path / "bench.json"
    if content is not None:
        path.write_text(content)
    good = RESULTS / "cpu-2026-11-21-final.json"
    with pytest.raises(SystemExit) as exit_:
        report.main([str(good), str(path)])
    captured = capsys.readouterr()
    assert exit_.value.code == 2
    assert f"error: {path}: {message}" in captured.err and "Traceback" not in captured.err, captured.err
    assert captured.out == "", "nothing is printed when one of the files is bad"


def test_report_prints_the_tables_of_a_committed_run(capsys):
    assert report.main([str(RESULTS / "cpu-2026-11-21-final.json")]) == 0
    out = capsys.readouterr().out
    assert "| (ii) conv2d | fwd | 36.96 (5%) |" in out and "3.93x" in out


def result(case, op, pass_, cupyconv_ms, alternatives, *, tags=(), target=None, floor_ms=None):
    """One case-pass as benchmarks.run records it: cupyconv's median and each alternative's (None: it failed)."""
    contenders = {"cupyconv": {"ours": True, "status": "ok", "median_ms": cupyconv_ms}}
    ratios = {}
    for name, ms in alternatives.items():
        if ms is None:
            contenders[name] = {"ours": False, "status": "error: outputs differ from the baseline"}
        else:
            contenders[name] = {"ours": False, "status": "ok", "median_ms": ms}
            ratios[name] = {"ratio_of_medians": cupyconv_ms / ms, "median_round_ratio": cupyconv_ms / ms}
    return {"case": case, "name": f"{op} {case}", "op": op, "tags": list(tags), "precision": "float16",
            "pass": pass_, "target": target, "baseline": next(iter(alternatives)), "contenders": contenders,
            "ratios": {"cupyconv": ratios}, "roofline": {"floor_ms": floor_ms}}


def test_progress_lines_count_time_and_estimate_what_is_left():
    stream = io.StringIO()
    progress = run.Progress(4, stream, deadline=None)
    first = result("r50-64-gpu16", "conv2d", "fwd", 0.1234, {"torch F.conv2d": 0.0981, "torch unfold+matmul+fold": None})
    line = progress.finished(first, now=progress.t0 + 10)
    assert line == ("[1/4] (r50-64-gpu16) conv2d float16 fwd: cupyconv 123.4 us vs torch F.conv2d 98.1 us (1.26x), "
                    "torch unfold+matmul+fold error | 0:10 elapsed, about 0:30 left")
    assert stream.getvalue() == line + "\n"
    progress.skip(1)   # the time limit kept one from starting
    line = progress.finished(first, now=progress.t0 + 30)
    assert line.startswith("[2/3]") and line.endswith("0:30 elapsed, about 0:15 left"), line
    line = progress.finished(first, now=progress.t0 + 45)
    assert line.startswith("[3/3]") and line.endswith("0:45 elapsed, about 0:00 left"), line

    quiet = run.Progress(10, None)
    quiet.deadline = quiet.t0 + 60   # --time-limit 60: the cases that can still start, and the one under way
    assert quiet.finished(first, now=quiet.t0 + 10).endswith("0:10 elapsed, about 1:00 left")   # not 1:30
    assert quiet.finished(first, now=quiet.t0 + 20).endswith("0:20 elapsed, about 0:50 left")
    assert quiet.finished(first, now=quiet.t0 + 70).endswith("1:10 elapsed, about 0:23 left")   # 70 s / 3


def test_a_run_prints_progress_on_stderr_unless_quiet(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    assert run.main(["--device", "cpu", "--smoke", "--cases", "iv", "--json", str(out)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (iv) unfold float32 ")[0] for line in lines] == ["[1/2]", "[2/2]"], lines
    assert "cupyconv" in lines[0] and " vs torch F.unfold " in lines[0] and "about 0:00 left" in lines[1]
    assert run.main(["--device", "cpu", "--smoke", "--cases", "iv", "--json", str(out), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
