"""The benchmark commands' own behaviour (no timing is checked): every command answers --help, report turns a bad
file into a one-line error."""
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
