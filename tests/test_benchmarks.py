"""The benchmark commands' own behaviour (no timing is checked): every command answers --help, report turns a bad
file into a one-line error, a run shows its progress on stderr."""
import io
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) leaves the checkout off the path
    sys.path.append(str(ROOT))

from benchmarks import gpu_check, host_overhead, launches, plot, predict, report, run, sass  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.parametrize("module", [run, report, gpu_check, predict, launches, sass, host_overhead],
                         ids=lambda m: m.__name__)
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


def result(case, op, pass_, cupyconv_ms, alternatives, *, tags=(), target=None, target_vs=None, floor_ms=None):
    """One case-pass as benchmarks.run records it: cupyconv's median and each alternative's (None: it failed); the
    target is against the first alternative (the baseline) unless target_vs names another."""
    contenders = {"cupyconv": {"ours": True, "status": "ok", "median_ms": cupyconv_ms, "iqr_pct": 5.0}}
    ratios = {}
    for name, ms in alternatives.items():
        if ms is None:
            contenders[name] = {"ours": False, "status": "error: outputs differ from the baseline"}
        else:
            contenders[name] = {"ours": False, "status": "ok", "median_ms": ms, "iqr_pct": 5.0}
            ratios[name] = {"ratio_of_medians": cupyconv_ms / ms, "median_round_ratio": cupyconv_ms / ms}
    return {"case": case, "name": f"{op} {case}", "op": op, "tags": list(tags), "precision": "float16",
            "pass": pass_, "target": target, "baseline": next(iter(alternatives)), "contenders": contenders,
            "ratios": {"cupyconv": ratios}, **({"target_check": {"vs": target_vs}} if target_vs else {}),
            "roofline": {"flops": 2e9, "bytes": 3e6, "floor_ms": floor_ms, "floor_bound": "compute"}}


def test_progress_lines_count_time_and_estimate_what_is_left():
    stream = io.StringIO()
    progress = run.Progress(4, stream, deadline=None)
    first = result("r50-64-gpu16", "conv2d", "fwd", 0.1234,
                   {"torch F.conv2d": 0.0981, "torch unfold+matmul+fold": None})
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


def synthetic_run(n_cases: int, floors: bool = True) -> dict:
    """A run of n_cases cases over three groups, forward and forward + backward, as benchmarks.run writes it."""
    results = []
    for i in range(n_cases):
        op, tags = [("conv2d", ("issue11",)), ("depthwise", ()), ("patch", ("issue11",))][i % 3]
        for pass_, scale in (("fwd", 1.0), ("fwd+bwd", 2.5)):
            results.append(result(f"{op}-case-{i}-gpu16", op, pass_, scale * (0.05 + 0.01 * i),
                                  {"torch F.conv2d": scale * 0.08, "torch unfold+matmul+fold": scale * 0.3 if i % 4
                                   else None}, tags=tags, target=1.3 if i % 2 else None,
                                  floor_ms=scale * 0.02 if floors else None))
    meta = {"command": "python -m benchmarks.run --device gpu --quick", "date": "2026-11-23T10:00:00+00:00",
            "cpu_model": "Test CPU", "cpus_usable": 2, "cupyconv": "0.1.0",
            "git_commit": "abc1234", "torch": "2.13.0", "cupy": None, "numpy": "2.4.6", "python": "3.11.7",
            "others_cpu_pct": 0.5, "gpu": {"name": "NVIDIA H200", "torch_cuda": "12.8", "cudnn": 91000}}
    return {"meta": meta, "mode": "quick", "complete": True, "results": results}


def test_rows_group_the_cases_and_keep_what_was_measured():
    data = synthetic_run(4)
    data["results"][0]["ratios"]["cupyconv"] = {}   # case 0 forward: cupyconv failed, so no ratio
    groups = plot.rows(data)
    assert [(name, [row.label for row in group]) for name, group in groups] == [
        ("conv2d issue11", ["conv2d-case-0-gpu16", "conv2d-case-3-gpu16"]),
        ("depthwise", ["depthwise-case-1-gpu16"]), ("patch issue11", ["patch-case-2-gpu16"])]
    case0, case3 = groups[0][1]
    assert case0.ratios == {"fwd": {}, "fwd+bwd": {"torch F.conv2d": pytest.approx(0.05 / 0.08)}}
    assert case3.ratios["fwd"] == {"torch F.conv2d": pytest.approx(0.08 / 0.08),
                                   "torch unfold+matmul+fold": pytest.approx(0.08 / 0.3)}
    assert case3.targets == {"fwd": (1.3, "torch F.conv2d"), "fwd+bwd": (1.3, "torch F.conv2d")}
    assert case0.targets == {}
    assert case3.floor_fraction == pytest.approx({"fwd": 0.02 / 0.08, "fwd+bwd": 0.05 / 0.2})

    fastest = "torch unfold+matmul+fold"   # a patch target is against the fastest alternative, not the baseline
    patch = result("p-seed-gpu16", "patch", "fwd", 0.1, {"torch F.conv2d": 0.2, fastest: 0.05}, target=0.8,
                   target_vs=fastest)
    [(_, [row])] = plot.rows({"results": [patch]})
    assert row.targets == {"fwd": (0.8, fastest)}


def png_size(path):
    """(width, height) of a PNG, which must start with the PNG signature and its IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_plot_of_60_cases_is_a_png_tall_enough_to_read(tmp_path):
    pytest.importorskip("matplotlib")
    small = plot.draw(synthetic_run(4, floors=False), tmp_path / "small.png")
    large = plot.draw(synthetic_run(60), tmp_path / "large.png")
    assert 10_000 < small.stat().st_size and large.stat().st_size < 200_000
    (w_small, h_small), (w_large, h_large) = png_size(small), png_size(large)
    assert w_large > w_small, "the roofline panel comes on top of the two passes"
    lines = 60 + 3   # cases and group headings
    assert h_large - h_small >= (lines - 4 - 3) * plot.ROW_INCHES * 100 * 0.99, (h_small, h_large)
    assert not list(tmp_path.glob("*.partial"))


def test_report_plot_writes_the_png_beside_the_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "gpu-bench.json"
    path.write_text(json.dumps(synthetic_run(6)))
    assert report.main(["--plot", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("**gpu-bench.json**") and captured.err == f"wrote {tmp_path / 'gpu-bench.png'}\n"
    assert min(png_size(tmp_path / "gpu-bench.png")) > 300


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib as if it were not installed (also where it is, and already imported)."""
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_matplotlib_report_plot_says_which_extra_to_install(tmp_path, capsys, no_matplotlib):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(synthetic_run(2)))
    with pytest.raises(SystemExit) as exit_:
        report.main(["--plot", str(path)])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert 'matplotlib is not installed; pip install -e ".[plot]"' in err and "Traceback" not in err, err
    assert not list(tmp_path.glob("*.png*"))


def test_without_matplotlib_a_run_still_writes_its_json(tmp_path, capsys, no_matplotlib):
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    assert run.main(["--device", "cpu", "--smoke", "--cases", "iv", "--json", str(out), "--quiet"]) == 0
    assert report.load(out)["complete"] and not (tmp_path / "bench.png").exists()
    err = capsys.readouterr().err
    assert err.startswith("no plot: matplotlib is not installed") and "benchmarks.report --plot" in err, err


def test_cuda_timer_times_queued_work_and_one_calls_latency(monkeypatch):
    """benchmarks.timing.CudaTimer with RECORDED FAKES of CuPy's device synchronisation and events (no GPU here):
    one synchronised call for the latency, then `count` calls enqueued between two events, the GPU time divided by
    the count."""
    cupy = pytest.importorskip("cupy")
    from benchmarks import timing
    log = []

    class FakeDevice:
        def synchronize(self):
            log.append("device sync")

    class FakeEvent:
        def __init__(self):
            self.name = "start" if not any(e.startswith("new") for e in log) else "end"
            log.append(f"new {self.name}")

        def record(self):
            log.append(f"record {self.name}")

        def synchronize(self):
            log.append(f"sync {self.name}")

    monkeypatch.setattr(cupy.cuda, "Device", FakeDevice)
    monkeypatch.setattr(cupy.cuda, "Event", FakeEvent)
    monkeypatch.setattr(cupy.cuda, "get_elapsed_time", lambda start, end: 8.0)   # milliseconds, as CuPy's
    sample = timing.CudaTimer("cupy")(lambda: log.append("call"), 4)
    assert log == ["device sync", "call", "device sync", "new start", "new end", "record start",
                   "call", "call", "call", "call", "record end", "sync end", "device sync"]
    assert sample["s"] == pytest.approx(8e-3 / 4) and sample["queued_calls"] == 4 and sample["latency_s"] > 0


def test_gpu_results_label_both_figures():
    """A GPU result (made up, as from a run) shows GPU ms and latency ms, each labelled, in the run's table and in
    the report."""
    from benchmarks.timing import TIMING
    entry = {"ours": True, "status": "ok", "median_ms": 0.25, "iqr_pct": 3.0, "n": 5, "latency_median_ms": 0.75}
    res = {"case": "x", "name": "made up", "op": "conv2d", "device": "gpu", "dtype": "float16", "pass": "fwd",
           "timing": TIMING["gpu"], "baseline": "torch", "rounds": 5, "tf32": {},
           "contenders": {"cupyconv": entry, "torch": {**entry, "ours": False, "median_ms": 0.5}},
           "ratios": {"cupyconv": {"torch": {"ratio_of_medians": 0.5, "median_round_ratio": 0.5}}}}
    text = run.format_result(res)
    assert "GPU ms: GPU time of queued work" in text and "latency ms: end-to-end latency per call" in text
    assert "GPU ms" in text.splitlines()[2] and "latency ms" in text.splitlines()[2]
    assert "     0.750" in text
    meta = {"command": "made up", "date": "today", "cpu_model": "cpu", "cpus_usable": 1, "python": "3", "numpy": "2",
            "torch": "2", "cupy": "14", "cupyconv": "0.1", "gpu": {"name": "a GPU"}}
    markdown = report.report(Path("x.json"), {"meta": meta, "mode": "quick", "results": [res]})
    assert "ms: GPU time of queued work" in markdown and "latency: end-to-end latency per call" in markdown
    assert "| cupyconv latency ms |" in markdown and "| 0.7500 |" in markdown


def test_host_profile_dry_run_of_the_torch_path(tmp_path):
    """host_profile --torch times cupyconv.torch's ops (the path the H200 measured 3.5-10x slower per call than the
    plain functions); the dry run exercises it on CPU tensors and keeps the kernels the CuPy path would launch."""
    pytest.importorskip("torch")
    from benchmarks import host_profile
    out = tmp_path / "profile.json"
    assert host_profile.main(["--json", str(out), "--no-cprofile", "--dry-run", "--torch", "--cases", "iii-gpu32",
                              "--calls", "2"]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"iii-gpu32-fwd-torch", "iii-gpu32-fwdbwd-torch"}
    assert all(r["host_us"] > 0 and r["kernels"] for r in report.values()), report
    # the benchmark's timer beside host_profile's, alone and interleaved with the baseline's turns
    timers = [r["benchmark_timer"] for r in report.values()]
    assert all(t["alone_us"] > 0 and t["interleaved_us"] > 0 and t["baseline"] == "torch F.conv2d" for t in timers)


def test_cupyconv_is_timed_as_it_comes_and_its_autotuning_as_a_contender_of_its_own():
    """benchmarks.run's "cupyconv" is the library's default (autotuning off, the heuristic's plan that
    benchmarks.predict models); "cupyconv (autotune)" runs the same calls with autotuning on, for the ops whose 'auto'
    autotunes, and records what it picked (`launches.autotune_picks`).  Here on host_overhead's NullGpu, every
    candidate timed alike (the heuristic's pick kept)."""
    pytest.importorskip("cupy")
    from benchmarks import cases
    from cupyconv import _autotune, settings
    names = {label: [c.name for c in cases.contenders_for(cases.select([label], ("gpu",))[0])]
             for label in ("r50-64-gpu16", "c3d-video-gpu16", "p-seed-gpu16", "dw-480-14-gpu16")}
    assert all("cupyconv" in n for n in names.values())
    assert [cases.AUTOTUNE in n for n in names.values()] == [True, True, False, False]
    assert cases.AUTOTUNE not in [c.name for c in cases.contenders_for(cases.select(["i"], ("cpu",))[0])]

    case = cases.select(["r50-64-gpu16"], ("gpu",))[0]
    device = host_overhead.null_gpu()
    device.timed = host_overhead._tie
    plain = cases._cupyconv_call(case, host_overhead.null_inputs(device, case), True)
    tuned = cases.autotuned(plain)
    with host_overhead.on_null_gpu(device, case):
        plain()
        assert not _autotune.MEASURED or all(k[-1] != device.key() for k in _autotune.MEASURED)
        tuned()
        assert settings.get_autotune() is False   # on for tuned's calls only
        untuned_picks, picks = launches.autotune_picks(plain), launches.autotune_picks(tuned)
    assert [p["pass"] for p in picks] == ["forward", "grad_input", "grad_weight"]
    assert all(p["algorithm"] == p["heuristic"] == "implicit_gemm" for p in picks + untuned_picks)
    assert all(set(p["candidates_us"]) == {"im2col_gemm", "direct", "implicit_gemm"} for p in picks)
    assert all(p["candidates_us"] is None for p in untuned_picks)
    head = run.format_result({"pass": "fwd", "ratios": {"cupyconv": {}, cases.AUTOTUNE: {}}, "contenders": {}})
    assert head.rstrip().endswith("cupyconv / it cc.autotune / it"), head


def test_a_run_records_the_autotune_contenders_picks(monkeypatch):
    """benchmarks.run notes "picks" on the "cupyconv (autotune)" contender (here stood in on the CPU, whose NumPy
    path resolves no 'auto' pass: no picks) and times it with the others, a ratio of its own."""
    from benchmarks import cases
    case = cases.smoke(cases.select(["i"], ("cpu",))[0])
    stand_in = cases.Contender(cases.AUTOTUNE, (case.op,), ("cpu",), "cupy",
                               lambda c, inputs, backward: cases.autotuned(cases.build_cupyconv(c, inputs, backward)),
                               ours=True)
    real = cases.contenders_for
    monkeypatch.setattr(cases, "contenders_for", lambda c: [*real(c), stand_in])
    result = run._measure(case, False, "smoke", None, None)
    entry = result["contenders"][cases.AUTOTUNE]
    assert entry["status"] == "ok" and entry["picks"] == [] and entry["median_ms"] > 0
    assert set(result["ratios"]) == {"cupyconv", cases.AUTOTUNE}


def test_report_lists_cupyconv_with_autotuning_among_the_others():
    from benchmarks.cases import AUTOTUNE
    path = RESULTS / "gpu-2026-11-26-h100" / "bench.json"
    data = json.loads(path.read_text())
    first = data["results"][0]
    first["contenders"][AUTOTUNE] = {**first["contenders"]["cupyconv"], "median_ms": 0.2}
    text = report.report(path, data)
    assert text.count(f"{AUTOTUNE}: 0.2") == 1, text[:3000]
