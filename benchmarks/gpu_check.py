"""One command for a GPU verification run: everything the first minutes on a GPU must produce, in one folder.

    python -m benchmarks.gpu_check --out benchmarks/results/gpu-DATE      # on a GPU machine, ~9 minutes
    python -m benchmarks.gpu_check --out /tmp/check --dry-run              # anywhere: checks the script itself

GPU time comes in short leases (10 minutes per command) on a stock CUDA image where nothing can be installed,
so the run needs only a source checkout and the image's CuPy, torch, pytest and compute-sanitizer.  Steps, each
in its own subprocess with its own time limit, so that a step which hangs or crashes is recorded and the next
one still runs:

  env        device, compute capability, SMs, driver, CUDA runtime, NVRTC, CuPy, torch and NumPy versions; the
             copy bandwidth and the fp16, bf16, TF32 and fp32 GEMM rates (benchmarks.run's `measure_peaks`)
  precompile `python -m cupyconv.precompile`: every kernel instantiation compiled on all cores into CuPy's disk
             cache, so that the tests do not spend their limit waiting for NVRTC one kernel at a time
  pytest     the whole `pytest -m gpu` suite with a JUnit XML, never stopping at the first failure; where the
             machine has an NVIDIA GPU (asked of the driver, not of CuPy), fewer tests run than `-m gpu` collected
             (skipped ones: a failing GPU probe, say) fail the step
  sanitizer  compute-sanitizer memcheck, racecheck and synccheck on SANITIZER_TESTS, a few small GPU tests that
             launch every kernel family of raw_kernels/conv.cu, depthwise.cu, patch.cu, unfold.cu, simt_gemm.cu and
             the 3-D tensor-core forward
  large      one fp16 case per op with more than 2^31 elements in its input or output (the 64-bit index
             instantiations), each output checked on sampled positions against a float64 sum computed from the
             inputs themselves
  profile    `benchmarks.host_profile` on PROFILE_CASES with autotuning off (the model's plan): host time per
             call, and each kernel's GPU time per call from torch.profiler's CUPTI trace; then the same with
             autotuning on for PROFILE_AUTOTUNE_CASES, with what autotuning picked (bench.json "profile_autotune")
  bench      the GPU benchmark suite (benchmarks.run --device gpu --quick), the issue-11 cases first, in what
             is left of the budget

and last a Markdown summary, printed and written as summary.md, with the performance model's calibration against
the predictions of record (benchmarks/results/predict-<gpu>.json): per kernel, the profile's CUPTI kernel time next
to the kernel's prediction (`benchmarks.calibrate`: the model's own terms, kernel against kernel), and per
case-pass, the benchmarks' wall time (host + GPU: a host-bound call measures its Python, not its kernels) next to
the case's predicted wall time, max(predicted GPU, predicted host: `benchmarks.predict`'s host model); the wall-time figures are added to bench.json's results under "prediction", and the
profile to bench.json under "profile" (run.log where there is no bench.json).  Files (never more than 8, none in a
subfolder): env.json, pytest.xml, pytest.log (the output of the pytest and sanitizer steps), large.json,
bench.json, bench.png (its plot, where matplotlib is installed), run.log (the output of the env, large, profile
and bench steps) and summary.md.

--dry-run needs no GPU, CuPy or compute-sanitizer and writes the same files, so CI keeps the script working
(tests/test_gpu_check.py): it collects the GPU tests and the sanitizer selection without running them (a node
id that no longer exists fails), runs the large-case checks on tiny shapes through the kernel emulator of
tests/emulator (the NumPy path where the emulator cannot build), runs the profile's host timing on the NumPy path
at smoke shapes with the kernels recorded instead of run (`host_profile --dry-run`), and runs the benchmark smoke
on the CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parents[1]
# cupyconv._device.WGMMA_ENV, set for every step: this run is where conv_fwd_wgmma, opt-in until a GPU has run it,
# meets the hardware (its -m gpu tests) and is timed (tests/test_gpu_check.py checks the two names agree)
WGMMA_ENV = "CUPYCONV_WGMMA"
OUTPUT_FILES = ("env.json", "pytest.xml", "pytest.log", "large.json", "bench.json", "bench.png", "run.log",
                "summary.md")
DEFAULT_BUDGET_S = 540   # a 10-minute command, less the machine's start-up and the copies back

# Each step's time limit at the default budget (scaled with --budget).  The benchmarks come last and get what the
# earlier steps left: at least BENCH_S, more when they finish early.  The tests get the most room: they matter
# most, and how long NVRTC takes to compile their kernels on a fresh machine is the least known.
# The precompile step takes what a cold NVRTC compile would otherwise take out of the tests' limit (all 368
# instantiations: about 125 s on one core, a prediction of ~15-30 s on 16 threads; not yet measured).
# The profile's 40 s come out of the benchmarks' share: kernel times to calibrate the model against are worth more
# than more wall times of host-bound calls (the first GPU run, 2026-11-26).  The last two profile cases are those
# the executed-instruction model (benchmarks.executed) moved most and no GPU has timed: 5x5 depthwise on 7x7 and
# 14x14 planes, predicted 2.4-3.9x slower than the static count had it.
STEP_S = {"env": 30, "precompile": 60, "pytest": 170, "sanitizer": 130, "large": 80, "profile": 55}
SUMMARY_S = 5
BENCH_S = DEFAULT_BUDGET_S - sum(STEP_S.values()) - SUMMARY_S
STEPS = ("env", "precompile", "pytest", "sanitizer", "large", "profile", "bench")
PROFILE_CASES = ("r50-64-gpu16", "p-seed-gpu16", "iii-gpu32", "dw-480-14-gpu16", "iv-gpu16", "r50-64-gpu32",
                 "dw-1152-7k5-gpu16", "dw-672-14k5-gpu32")
PROFILE_CALLS = 10
# ... and these again with autotuning on (benchmarks.run's "cupyconv (autotune)" contender), in a second process
# within the step's limit (the first H100 run's profile took 12.7 of its 55 s): host and kernel time per call
# next to the autotune-off figures of the same step, and what autotuning picked (bench.json "profile_autotune")
PROFILE_AUTOTUNE_CASES = ("r50-64-gpu16", "r50-64-gpu32", "r50-256-gpu16")
SANITIZER_SHARE = {"memcheck": 0.3, "racecheck": 0.4, "synccheck": 0.3}   # racecheck is the slowest tool
INTERRUPT_GRACE_S = 15   # after a step's limit: SIGINT (pytest still writes its XML), then SIGKILL

# Small GPU tests that launch every kernel family, for the sanitizers (each tool runs all of them).
SANITIZER_TESTS = (
    # unfold.cu: unfold_im2col and fold_col2im, per-side padding, stride and dilation; float16 and float32
    "tests/test_unfold_kernels.py::test_gpu_matches_cpu_path[case1-float32]",
    "tests/test_unfold_kernels.py::test_gpu_matches_cpu_path[case3-float16]",
    # conv.cu: conv_fwd_direct and the im2col path (conv_fwd_bias, conv_bgrad, with unfold.cu), forward and
    # backward; the tensor-core passes (mma.sync) forward and backward in float16
    "tests/test_conv_kernels.py::test_gpu_matches_cpu_path[everything-direct]",
    "tests/test_conv_kernels.py::test_gpu_matches_cpu_path[everything-im2col_gemm]",
    "tests/test_conv_kernels.py::test_gpu_dtypes[float16-direct]",
    "tests/test_tensor_core_kernels.py::test_gpu_conv2d_forward[tc_groups2_stride2_asymmetric-float16]",
    "tests/test_tensor_core_kernels.py::test_gpu_conv2d_backward[tc_groups2_stride2_asymmetric-float16]",
    # depthwise.cu: every kernel family once with 64-bit indices, and three 32-bit ones
    "tests/test_depthwise_kernels.py::test_gpu_64_bit_index_variants",
    "tests/test_depthwise_kernels.py::test_gpu_matches_cpu_path[k3s1_packed_images-float32]",
    "tests/test_depthwise_kernels.py::test_gpu_matches_cpu_path[rect_per_side_stride21-float16]",
    "tests/test_depthwise_kernels.py::test_gpu_matches_cpu_path[k7_dilation2_multiplier2-float32]",
    # patch.cu: the fused kernels forward and backward, and the tensor-core path of patch_conv2d
    "tests/test_patch_kernels.py::test_gpu_forward_backward[groups2_per_side_padding-fused]",
    "tests/test_patch_kernels.py::test_gpu_dtypes[seed_like_4x4_k3_p1_odd_n-fused-float16]",
    "tests/test_tensor_core_kernels.py::test_gpu_patch_conv2d_seed_like[float16]",
    # simt_gemm.cu: strict fp32 forward, input and weight gradients, its cp.async zero-fill at per-side padding
    "tests/test_simt_gemm_kernels.py::test_gpu_matches_cpu_path[groups2_stride_dilation_per_axis]",
    # implicit_gemm.cu's conv_fwd_igemm_3d: the 3-D forward and stride-1 input gradient
    "tests/test_igemm_3d.py::test_gpu_forward_and_gradients_match_cpu_path[plain-float16]",
)
# Under a sanitizer every allocation must be its own cudaMalloc: inside a pool block, a read past an array's end
# is a valid address and memcheck cannot see it.
NO_POOL_PYTEST = ("import sys, cupy; cupy.cuda.set_allocator(None); cupy.cuda.set_pinned_memory_allocator(None); "
                  "import pytest; sys.exit(pytest.main(sys.argv[1:]))")
SANITIZER_EXIT = 86   # compute-sanitizer's exit code when it found something, apart from the tests' own
SANITIZER_OPTIONS = (("--error-exitcode", str(SANITIZER_EXIT)), ("--print-limit", "100"),
                     ("--report-api-errors", "no"), ("--require-cuda-init", "no"))


# ---------------------------------------------------------------------------------------------------------
# Running one step


def run_process(cmd, log: Path, timeout: float, *, mode: str = "a", env: dict | None = None) -> dict:
    """Run cmd in its own process group with stdout and stderr appended to log; after `timeout` seconds send the
    group SIGINT (pytest and the benchmarks still write what they have), then SIGKILL.  Returns rc, seconds,
    timed_out."""
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", WGMMA_ENV: "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    t0 = time.perf_counter()
    with open(log, mode) as out:
        out.write(f"$ {shlex.join(map(str, cmd))}\n")
        out.flush()
        process = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        except BaseException:   # this script interrupted: take the step's processes down with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
        seconds = time.perf_counter() - t0
        out.write(f"# exit code {process.returncode}{', timed out' if timed_out else ''}, {seconds:.1f} s\n")
    return {"rc": process.returncode, "seconds": round(seconds, 1), "timed_out": timed_out}


def status_of(run: dict, ok: bool = True) -> str:
    if run["timed_out"]:
        return "timed out"
    return "ok" if run["rc"] == 0 and ok else "failed"


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, or where CUDA images install it."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    local = Path("/usr/local")
    candidates = [local / "cuda/bin", local / "cuda/compute-sanitizer", *sorted(local.glob("cuda-*/bin")),
                  *sorted(local.glob("cuda-*/compute-sanitizer"))]
    for folder in candidates:
        if (folder / "compute-sanitizer").is_file():
            return str(folder / "compute-sanitizer")
    return None


def log_since(log: Path, start: int = 0) -> str:
    """What the log holds from byte `start` on ("" where there is no log): one step's part of a shared log."""
    return log.read_bytes()[start:].decode(errors="replace") if log.exists() else ""


def collected(output: str) -> int | None:
    """The number of tests pytest said it collected ('269/1516 tests collected' or '13 tests collected')."""
    counts = re.findall(r"(\d+)(?:/\d+)? tests? collected", output)
    return int(counts[-1]) if counts else None


@dataclass
class Check:
    """What one run of this script does: its folder, mode and deadlines."""
    out: Path
    dry_run: bool
    budget_s: float
    t0: float

    def path(self, name: str) -> Path:
        return self.out / name

    def limit(self, step: str) -> float:
        """The step's time limit: its share of the budget; the benchmarks get what is left, less the summary's
        reserve (BENCH_S or more when the earlier steps keep to their limits)."""
        scale = self.budget_s / DEFAULT_BUDGET_S
        if step != "bench":
            return STEP_S[step] * scale
        return max(self.budget_s - (time.perf_counter() - self.t0) - SUMMARY_S * scale, 30)

    def python(self, *args) -> list:
        return [sys.executable, *args]

    def worker(self, name: str) -> list:
        return self.python("-m", "benchmarks.gpu_check", "--worker", name, "--out", self.out,
                           *(["--dry-run"] if self.dry_run else []))


def step_env(check: Check, limit: float) -> dict:
    run = run_process(check.worker("env"), check.path("run.log"), limit)
    return {**run, "status": status_of(run, check.path("env.json").exists())}


def step_precompile(check: Check, limit: float) -> dict:
    args = ["--dry-run"] if check.dry_run else ["--jobs", str(os.cpu_count() or 1)]
    log = check.path("run.log")
    before = log.stat().st_size if log.exists() else 0
    run = run_process(check.python("-m", "cupyconv.precompile", *args), log, limit)
    summary = re.findall(r"^(?:compiled|would compile) (\d+)", log_since(log, before), re.M)
    return {**run, "status": status_of(run, bool(summary)), "kernels": int(summary[-1]) if summary else None}


def selected(output: str) -> int | None:
    """How many tests the -m selection of a pytest run kept ('collected 2937 items / 2590 deselected / 347
    selected', or all of them: 'collected 12 items'), or what --collect-only -q reports (`collected`)."""
    match = re.search(r"collected (\d+) items?(?: / (\d+) deselected)?(?: / (\d+) selected)?", output)
    if match is None:
        return collected(output)
    total, deselected, kept = (int(g) if g else None for g in match.groups())
    return kept if kept is not None else total - (deselected or 0)


def gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU, asked of the driver (its /proc entries, or `nvidia-smi -L`), never of
    CuPy: a CuPy that cannot see the GPU is what the pytest step must not mistake for a machine without one."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(re.search(r"^GPU \d+:", listing, re.M))


# Skips a GPU machine may make without a gap in the suite: what this machine lacks by design, not what failed.
HARDWARE_SKIPS = re.compile(r"needs two CUDA GPUs")


def pytest_counts(xml: Path) -> dict | None:
    """{tests, failures, errors, skipped, hardware_skips} of a JUnit XML (hardware_skips: the skipped tests whose
    reason is one of HARDWARE_SKIPS), None where there is none to read."""
    try:
        root = ElementTree.parse(xml).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["hardware_skips"] = sum(bool(HARDWARE_SKIPS.search(skip.get("message") or ""))
                                   for case in root.iter("testcase") for skip in case.findall("skipped"))
    return counts


def judge_pytest(run: dict, expected: int | None, counts: dict | None, gpu: bool) -> str:
    """The pytest step's status: status_of(run), and with a GPU on the machine 'failed' unless every test that
    `-m gpu` selected ran (was not skipped), those skipped for hardware this machine lacks (HARDWARE_SKIPS: a
    second GPU) excepted: a suite that skips cannot pass."""
    status = status_of(run)
    if status != "ok" or not gpu:
        return status
    if expected is None or counts is None:
        return "failed: GPU present, but the number of GPU tests collected or run is unknown (see pytest.log)"
    ran = counts["tests"] - counts["skipped"]
    expected -= counts.get("hardware_skips", 0)
    if ran < expected:
        return f"failed: GPU present, but only {ran} of the {expected} collected GPU tests ran ({counts['skipped']} skipped)"
    return status


def step_pytest(check: Check, limit: float) -> dict:
    args = ["-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "--junitxml", check.path("pytest.xml")]
    if check.dry_run:
        args += ["--collect-only", "-q"]
    else:
        args += ["-rfEs", "--durations=15"]   # s: the skip reasons (the GPU probe's among them) in the log
        if importlib.util.find_spec("pytest_timeout"):   # on the CUDA image: one hanging test fails alone
            args += ["--timeout=120"]
    run = run_process(check.python(*args), check.path("pytest.log"), limit, mode="w")
    output = log_since(check.path("pytest.log"))
    if check.dry_run:
        return {**run, "status": status_of(run), "collected": collected(output)}
    expected, gpu = selected(output), gpu_present()
    return {**run, "status": judge_pytest(run, expected, pytest_counts(check.path("pytest.xml")), gpu),
            "collected": expected, "gpu_present": gpu}


def step_sanitizer(check: Check, limit: float) -> dict:
    """Its output is appended to pytest.log, after the suite's: a log of its own would make 9 files with bench.png."""
    log = check.path("pytest.log")
    sanitizer = find_sanitizer()
    result = {"compute_sanitizer": sanitizer or "not found", "tests": list(SANITIZER_TESTS), "tools": {}}
    if check.dry_run:   # the selection must still exist: pytest fails on a node id it cannot find
        with open(log, "a") as out:
            out.write("\n===== the sanitizer selection, collected only (dry run)\n")
        before = log.stat().st_size
        run = run_process(check.python("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                       *SANITIZER_TESTS), log, limit)
        count = collected(log_since(log, before))
        return {**result, **run, "collected": count, "status": status_of(run, count == len(SANITIZER_TESTS))}
    if sanitizer is None:
        return {**result, "status": "not found", "seconds": 0.0}
    try:
        usage = subprocess.run([sanitizer, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {**result, "status": f"error: {sanitizer} --help: {e}", "seconds": 0.0}
    options = [part for option in SANITIZER_OPTIONS if option[0] in usage for part in option]
    t_step = time.perf_counter()
    for tool, share in SANITIZER_SHARE.items():
        left = limit - (time.perf_counter() - t_step)
        with open(log, "a") as out:
            out.write(f"\n===== {tool}, CuPy's and torch's memory pools off\n")
        before = log.stat().st_size
        run = run_process([sanitizer, "--tool", tool, *options, sys.executable, "-c", NO_POOL_PYTEST, "-q", "-rfE",
                           "-p", "no:cacheprovider", *SANITIZER_TESTS], log, min(limit * share, left),
                          env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})   # torch's pool would hide reads too
        output = log_since(log, before)
        found = [int(n) for n in re.findall(r"(?:ERROR SUMMARY|RACECHECK SUMMARY): (\d+) (?:error|hazard)", output)]
        tests = re.findall(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected).*?) in [\d.]+s", output, re.M)
        tests = tests[-1] if tests else None
        result["tools"][tool] = {**run, "sanitizer_errors": sum(found) if found else None, "tests": tests,
                                 "status": "timed out" if run["timed_out"] else
                                 "errors found" if run["rc"] == SANITIZER_EXIT or sum(found) else
                                 "failed" if run["rc"] != 0 else
                                 "ok" if "passed" in (tests or "") else "no test ran"}
    statuses = {t["status"] for t in result["tools"].values()}
    return {**result, "seconds": round(time.perf_counter() - t_step, 1),
            "status": "ok" if statuses == {"ok"} else ", ".join(sorted(statuses - {"ok"}))}


def step_large(check: Check, limit: float) -> dict:
    run = run_process(check.worker("large"), check.path("run.log"), limit)
    return {**run, "status": status_of(run, check.path("large.json").exists())}


def profile_json(check: Check, autotune: bool = False) -> Path:
    """Where the profile step's JSON (autotune off, or on) waits (outside --out, which keeps to its 8 files) until
    `calibrate` folds it into bench.json."""
    return Path(tempfile.gettempdir()) / f"cupyconv-gpu-check-{os.getpid()}-profile{'-autotune' * autotune}.json"


def step_profile(check: Check, limit: float) -> dict:
    """host_profile with autotuning off on PROFILE_CASES, then on for PROFILE_AUTOTUNE_CASES in what is left of the
    limit; the step's status is the first run's (the calibration's), the second's is its "autotune" entry."""
    t0 = time.perf_counter()
    runs = []
    for autotune, cases in ((False, PROFILE_CASES), (True, PROFILE_AUTOTUNE_CASES)):
        target = profile_json(check, autotune)
        target.unlink(missing_ok=True)
        args = ["--json", target, "--no-cprofile", "--autotune", "on" if autotune else "off", "--cases",
                ",".join(cases), "--calls", str(PROFILE_CALLS), *(["--dry-run"] if check.dry_run else [])]
        run = run_process(check.python("-m", "benchmarks.host_profile", *args), check.path("run.log"),
                          limit - (time.perf_counter() - t0))
        runs.append({**run, "status": status_of(run, target.exists())})
    status = runs[0]["status"] + ("" if runs[1]["status"] == "ok" else f"; autotune on: {runs[1]['status']}")
    return {**runs[0], "status": status, "seconds": round(time.perf_counter() - t0, 1), "autotune": runs[1]}


def measured_labels(results: Path = ROOT / "benchmarks" / "results") -> set[str]:
    """The GPU case labels some earlier run's bench.json (benchmarks/results/gpu-*/) holds a result of."""
    labels = set()
    for path in results.glob("gpu-*/bench.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            labels.update(r["case"] for r in json.loads(path.read_text())["results"])
    return labels


def bench_order(measured: set[str] | None = None) -> list[str]:
    """Every GPU case: those no GPU run has measured yet first (a lease's benchmark step reaches about 100 of
    them: the H100's first run left 66 case-passes unstarted), the issue-11 ones first within each part."""
    from . import cases
    measured = measured_labels() if measured is None else measured
    gpu = cases.select([], ("gpu",))
    return [c.label for new in (True, False) for issue11 in (True, False) for c in gpu
            if (c.label not in measured) == new and ("issue11" in c.tags) == issue11]


def step_bench(check: Check, limit: float) -> dict:
    bench = check.path("bench.json")
    if check.dry_run:
        args = ["--device", "cpu", "--smoke"]
    else:   # stop starting cases in time to finish the one under way and write the JSON
        args = ["--device", "gpu", "--quick", "--cases", ",".join(bench_order()),
                "--time-limit", f"{max(limit - 30, 10):.0f}"]
    run = run_process(check.python("-m", "benchmarks.run", *args, "--json", bench), check.path("run.log"), limit)
    bench.with_name(bench.name + ".partial").unlink(missing_ok=True)   # left by a run killed while writing
    return {**run, "status": status_of(run, bench.exists())}


STEP_FUNCTIONS = {"env": step_env, "precompile": step_precompile, "pytest": step_pytest, "sanitizer": step_sanitizer,
                  "large": step_large, "profile": step_profile, "bench": step_bench}
STEP_TEXT = {
    "env": ("device, versions, copy bandwidth, GEMM rates", "versions; GEMM and copy timed on the CPU (tiny)"),
    "precompile": ("python -m cupyconv.precompile (every kernel, all cores)", "precompile --dry-run (the list)"),
    "pytest": ("pytest -m gpu with a JUnit XML; fewer run than collected fails", "collect the pytest -m gpu selection"),
    "sanitizer": ("compute-sanitizer memcheck, racecheck, synccheck", "collect the sanitizer selection"),
    "large": ("one fp16 case per op above 2^31 elements", "the same checks on tiny shapes (emulator)"),
    "profile": ("benchmarks.host_profile: host and CUPTI kernel time per call", "host_profile --dry-run (NumPy, "
                                                                               "kernels recorded)"),
    "bench": ("benchmarks.run --device gpu --quick, issue-11 cases first", "benchmarks.run --device cpu --smoke"),
}


# ---------------------------------------------------------------------------------------------------------
# Worker: env


def worker_env(out: Path, dry_run: bool) -> int:
    from . import run as bench_run
    info = {"dry_run": dry_run, "errors": {}}
    try:
        info["meta"] = bench_run.environment("cpu" if dry_run else "gpu")
    except Exception as e:   # torch without CUDA, say: the rest still helps
        info["errors"]["environment"] = f"{type(e).__name__}: {e}"
        info["meta"] = bench_run.environment("cpu")
    info["meta"]["command"] = "python -m benchmarks.gpu_check " + " ".join(sys.argv[1:])
    sanitizer = find_sanitizer()
    info["compute_sanitizer"] = {"path": sanitizer or "not found"}
    if sanitizer:
        with contextlib.suppress(Exception):
            info["compute_sanitizer"]["version"] = subprocess.run(
                [sanitizer, "--version"], capture_output=True, text=True, timeout=60).stdout.strip().splitlines()[-1]
    if not dry_run:
        try:
            import cupy
            props = cupy.cuda.runtime.getDeviceProperties(0)
            info["cupy_device"] = {
                "name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                "compute_capability": f"{props['major']}.{props['minor']}",
                "sm_count": props["multiProcessorCount"], "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
                "l2_mib": round(props["l2CacheSize"] / 2**20, 1),
                "shared_per_block_optin_kib": props.get("sharedMemPerBlockOptin", 0) // 1024,
                "driver": cupy.cuda.runtime.driverGetVersion(), "runtime": cupy.cuda.runtime.runtimeGetVersion(),
                "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion()))}
        except Exception as e:
            info["errors"]["cupy"] = f"{type(e).__name__}: {e}"
        with contextlib.suppress(Exception):
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,"
                 "temperature.gpu,memory.used,memory.total", "--format=csv"],
                capture_output=True, text=True, timeout=30).stdout.strip()
    try:   # the roofline references the benchmarks use: torch.matmul (cuBLAS) at n = 8192, a 1 GiB copy
        info["peaks"] = bench_run.measure_peaks(("float16", "bfloat16", "tf32", "float32"),
                                                "cpu" if dry_run else "gpu", "smoke" if dry_run else "quick", print)
    except Exception as e:
        info["errors"]["peaks"] = f"{type(e).__name__}: {e}"
    (out / "env.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    return 0 if not info["errors"] else 1


# ---------------------------------------------------------------------------------------------------------
# Worker: large cases

# Sampled outputs are checked against sums computed in float64 from the fp16 inputs: |got - ref| / sum |terms|.
# A correct fp16 result is off by at most 2^-11 of |ref| for its final rounding (twice that where the bias is
# added after the GEMM's rounding), while a wrong index reads an unrelated element: an error near 1.
LARGE_TOLERANCE = 2**-9
SAMPLES = 200
POISON_SLACK = 2**30


@dataclass(frozen=True)
class LargeCase:
    op: str              # "conv2d" | "depthwise" | "patch" | "unfold" (unfold, then fold of its output)
    x: tuple             # input shape; stride 1, dilation 1, padding `pad` on every side, a k x k kernel
    out_channels: int = 0
    algorithms: tuple = ("auto",)
    k: int = 3
    pad: int = 1


# Input or output above 2^31 elements (4.3 GB in fp16) so that every kernel takes its `long long` instantiation;
# small channel counts keep each op to seconds, not minutes (an estimate: none has run on a GPU yet).
LARGE_CASES = (
    LargeCase("conv2d", (8193, 16, 128, 128), 16, ("implicit_gemm", "direct", "im2col_gemm")),
    LargeCase("depthwise", (8193, 8, 128, 128), 16),   # channel multiplier 2: the output is the large one
    LargeCase("patch", (1, 4194305, 32, 4, 4), 32, ("implicit_gemm", "fused", "im2col_gemm")),
    LargeCase("unfold", (1025, 16, 128, 128)),
)
# --dry-run: the same problems and algorithms at a size the emulator runs in moments.
TINY_CASES = (
    LargeCase("conv2d", (2, 16, 9, 8), 16, ("implicit_gemm", "direct", "im2col_gemm")),
    LargeCase("depthwise", (2, 8, 9, 8), 16),
    LargeCase("patch", (1, 3, 32, 4, 4), 32, ("implicit_gemm", "fused", "im2col_gemm")),
    LargeCase("unfold", (2, 3, 9, 8)),
)


def host(a) -> numpy.ndarray:
    """A float64 NumPy copy of a NumPy or CuPy array (a small slice: one copy from the device)."""
    if type(a).__module__.startswith("cupy"):
        a = a.get()
    return numpy.asarray(a, dtype=numpy.float64)


def random_array(xp, shape, scale, seed):
    """Normal values times scale, float16; drawn in float32 chunks so the draw never needs 8 GB more."""
    if xp is numpy:
        return (numpy.random.default_rng(seed).standard_normal(shape, dtype=numpy.float32) * scale).astype(
            numpy.float16)
    out = xp.empty(shape, dtype=xp.float16)
    flat, state, chunk = out.reshape(-1), xp.random.RandomState(seed), 2**28
    for start in range(0, flat.size, chunk):
        flat[start:start + chunk] = state.standard_normal(min(chunk, flat.size - start), dtype=numpy.float32) * scale
    return out


def positions(shape, rng) -> list[tuple]:
    """The first and last elements, those around flat index 2^31, and SAMPLES random ones."""
    size = math.prod(shape)
    flat = sorted({0, size - 1} | {i for i in (2**31 - 1, 2**31, 2**31 + 1) if i < size})
    flat += rng.integers(0, size, SAMPLES).tolist()
    return [tuple(int(v) for v in index) for index in zip(*numpy.unravel_index(flat, shape))]


def taps(coord: int, size: int, case: LargeCase):
    """(tap, input coordinate) of the taps of output `coord` that fall inside the input, not the padding."""
    return [(i, coord - case.pad + i) for i in range(case.k) if 0 <= coord - case.pad + i < size]


def out_taps(coord: int, out_size: int, case: LargeCase):
    """(tap, output coordinate) of the outputs whose window reads input `coord` through that tap."""
    return [(i, coord + case.pad - i) for i in range(case.k) if 0 <= coord + case.pad - i < out_size]


def forward_reference(case: LargeCase, x, w, b, pos: tuple, multiplier: int):
    """(sum, sum of |terms|) of output (..., d, oh, ow) from x (..., C, H, W) and the host weight and bias."""
    *lead, d, oh, ow = pos
    channels = slice(d // multiplier, d // multiplier + 1) if case.op == "depthwise" else slice(None)
    total, scale = b[d], abs(b[d])
    for i, ih in taps(oh, x.shape[-2], case):
        for j, iw in taps(ow, x.shape[-1], case):
            terms = host(x[(*lead, channels, ih, iw)]) * w[d, :, i, j]
            total, scale = total + terms.sum(), scale + numpy.abs(terms).sum()
    return total, scale


def grad_input_reference(case: LargeCase, gy, w, pos: tuple, multiplier: int):
    """(sum, sum of |terms|) of grad input (..., c, h, w) from gy (..., D, oH, oW) and the host weight."""
    *lead, c, h, w_ = pos
    if case.op == "depthwise":
        outputs, weights = slice(c * multiplier, (c + 1) * multiplier), w[c * multiplier:(c + 1) * multiplier, 0]
    else:
        outputs, weights = slice(None), w[:, c]
    total = scale = 0.0
    for i, oh in out_taps(h, gy.shape[-2], case):
        for j, ow in out_taps(w_, gy.shape[-1], case):
            terms = host(gy[(*lead, outputs, oh, ow)]) * weights[:, i, j]
            total, scale = total + terms.sum(), scale + numpy.abs(terms).sum()
    return total, scale


def unfold_reference(case: LargeCase, x, pos: tuple, out_w: int):
    """cols (..., c * k * k + i * k + j, oh * oW + ow) is x (..., c, oh - pad + i, ow - pad + j), or 0 in the
    padding."""
    *lead, row, column = pos
    c, tap = divmod(row, case.k * case.k)
    (i, j), (oh, ow) = divmod(tap, case.k), divmod(column, out_w)
    ih, iw = oh - case.pad + i, ow - case.pad + j
    if 0 <= ih < x.shape[-2] and 0 <= iw < x.shape[-1]:
        value = float(host(x[(*lead, c, ih, iw)]))
        return value, abs(value)
    return 0.0, 0.0


def fold_reference(case: LargeCase, cols, pos: tuple, out_w: int):
    """fold's (..., c, h, w): the sum of the cols entries of every window that covers it."""
    *lead, c, h, w = pos
    total = scale = 0.0
    for i, oh in out_taps(h, cols.shape[-1] // out_w, case):
        for j, ow in out_taps(w, out_w, case):
            value = float(host(cols[(*lead, (c * case.k + i) * case.k + j, oh * out_w + ow)]))
            total, scale = total + value, scale + abs(value)
    return total, scale


def compare(xp, out, reference, rng) -> dict:
    """out at `positions` against reference(pos) -> (value, sum of |terms|); and its non-finite elements."""
    got, want, errors = [], [], []
    for pos in positions(out.shape, rng):
        value, scale = reference(pos)
        g = float(host(out[pos]))
        err = abs(g - value)
        errors.append(err / scale if scale > 0 else (0.0 if err == 0 else math.inf))
        got.append(g)
        want.append(value)
    got, want = numpy.array(got), numpy.array(want)
    return {"samples": len(errors), "max_err_over_sum_abs_terms": float(max(errors)),
            "rel_l2": float(numpy.linalg.norm(got - want) / max(float(numpy.linalg.norm(want)), 1e-300)),
            "nonfinite": int(xp.count_nonzero(~xp.isfinite(out)))}


def poison_pool(xp, nbytes: int) -> None:
    """Best effort: leave a freed block of 0xFF bytes (NaN in fp16) in CuPy's pool, so that the op's output, cut
    from it next, starts as NaN and an element no kernel writes shows as non-finite."""
    if xp is not numpy:
        block = xp.empty(nbytes + POISON_SLACK, dtype=xp.uint8)
        block.fill(0xFF)
        del block


def synchronize(xp) -> None:
    if xp is not numpy:
        xp.cuda.Device().synchronize()


def out_shape(case: LargeCase) -> tuple:
    *lead, channels, h, w = case.x
    oh, ow = h + 2 * case.pad - case.k + 1, w + 2 * case.pad - case.k + 1
    if case.op == "unfold":
        return (*lead, channels * case.k * case.k, oh * ow)
    return (*lead, case.out_channels, oh, ow)


def run_large_case(case: LargeCase, xp, seed: int, record) -> None:
    """Each check of one case: the forward of every algorithm and grad input (unfold: unfold, then fold)."""
    import cupyconv
    rng = numpy.random.default_rng(seed)
    shape_y = out_shape(case)
    x_elements, y_elements = math.prod(case.x), math.prod(shape_y)
    base = {"op": case.op, "dtype": "float16", "x": case.x, "out": shape_y, "x_elements": x_elements,
            "out_elements": y_elements, "over_2_31": max(x_elements, y_elements) > 2**31 - 1,
            "kernel": case.k, "padding": case.pad}
    if xp is not numpy:   # forward: x and y; backward: x, gy and grad x; the poison block and a workspace
        xp.get_default_memory_pool().free_all_blocks()
        need = 2 * (2 * x_elements + 2 * y_elements) + POISON_SLACK + 2**30
        free = xp.cuda.runtime.memGetInfo()[0]
        if free < need:
            record({**base, "check": "all", "algorithm": "-", "ok": None,
                    "status": f"skipped: needs {need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"})
            return
    x = random_array(xp, case.x, 1.0, seed)

    def check(name: str, algorithm: str, compute):
        entry = {**base, "check": name, "algorithm": algorithm}
        out = None
        try:
            poison_pool(xp, 2 * (x_elements if name in ("grad_input", "fold") else y_elements))
            synchronize(xp)
            t0 = time.perf_counter()
            out, reference = compute()
            synchronize(xp)
            entry["seconds"] = round(time.perf_counter() - t0, 3)
            entry.update(compare(xp, out, reference, rng))
            entry["ok"] = entry["max_err_over_sum_abs_terms"] <= LARGE_TOLERANCE and entry["nonfinite"] == 0
            entry["status"] = "ok" if entry["ok"] else "failed"
        except Exception as e:
            entry.update(ok=False, status=f"error: {type(e).__name__}: {str(e)[:300]}")
        record(entry)
        return out

    if case.op == "unfold":
        out_w = case.x[-1] + 2 * case.pad - case.k + 1
        cols = check("unfold", "auto", lambda: (cupyconv.unfold(x, case.k, padding=case.pad),
                                                 lambda pos: unfold_reference(case, x, pos, out_w)))
        if cols is not None:
            check("fold", "auto", lambda: (cupyconv.fold(cols, case.x[-2:], case.k, padding=case.pad),
                                           lambda pos: fold_reference(case, cols, pos, out_w)))
        return
    channels = case.x[-3]
    per_output = 1 if case.op == "depthwise" else channels
    w = random_array(xp, (case.out_channels, per_output, case.k, case.k), (per_output * case.k ** 2) ** -0.5, seed + 1)
    b = random_array(xp, (case.out_channels,), 0.1, seed + 2)
    w_host, b_host, multiplier = host(w), host(b), case.out_channels // channels
    forward = {"conv2d": cupyconv.conv2d, "depthwise": cupyconv.depthwise_conv2d, "patch": cupyconv.patch_conv2d}
    backward = {"conv2d": cupyconv.conv2d_backward, "depthwise": cupyconv.depthwise_conv2d_backward,
                "patch": cupyconv.patch_conv2d_backward}
    for algorithm in case.algorithms:
        chosen = {} if case.op == "depthwise" else {"algorithm": algorithm}
        check("forward", algorithm, lambda chosen=chosen: (
            forward[case.op](x, w, b, padding=case.pad, **chosen),
            lambda pos: forward_reference(case, x, w_host, b_host, pos, multiplier)))
    gy = random_array(xp, shape_y, 1.0, seed + 3)
    check("grad_input", "auto", lambda: (backward[case.op](gy, x, w, padding=case.pad, needs=("input",))[0],
                                         lambda pos: grad_input_reference(case, gy, w_host, pos, multiplier)))


def emulator_context():
    """(context, path) for --dry-run: the kernel emulator of tests/emulator where it builds, else the NumPy path."""
    import cupyconv
    try:
        from cupyconv._device import use_device

        from ._emulator import emulator
        device = emulator().EmulatedDevice()
        with use_device(device):   # builds the emulator's library of unfold.cu, or fails here
            cupyconv.unfold(numpy.ones((1, 1, 2, 2), numpy.float16), 1)
        return use_device(device), "emulator"
    except Exception as e:
        return contextlib.nullcontext(), f"numpy (the emulator failed: {type(e).__name__}: {str(e)[:200]})"


def worker_large(out: Path, dry_run: bool) -> int:
    if dry_run:
        xp, cases = numpy, TINY_CASES
        context, path = emulator_context()
    else:
        import cupy as xp
        cases, context, path = LARGE_CASES, contextlib.nullcontext(), "cuda"
    checks = []
    target = out / "large.json"

    def write(complete: bool) -> None:
        payload = {"dry_run": dry_run, "path": path, "tolerance": LARGE_TOLERANCE, "samples_per_check": SAMPLES,
                   "complete": complete, "checks": checks}
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        partial.replace(target)

    def record(entry: dict) -> None:
        checks.append({**entry, "path": path})
        print(f"large: {entry['op']} {entry['check']} {entry['algorithm']}: {entry['status']}"
              + (f", max err {entry['max_err_over_sum_abs_terms']:.3g}" if "max_err_over_sum_abs_terms" in entry
                 else "") + (f", {entry['seconds']} s" if "seconds" in entry else ""), flush=True)
        write(False)

    with context:
        for i, case in enumerate(cases):
            run_large_case(case, xp, 100 + 10 * i, record)
            if xp is not numpy:
                xp.get_default_memory_pool().free_all_blocks()
    write(True)
    return 0 if all(c["ok"] is not False for c in checks) else 1


# ---------------------------------------------------------------------------------------------------------
# Summary


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _cuda_version(v) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) else str(v)


def summary_env(env) -> list[str]:
    if not env:
        return ["No env.json (see run.log)."]
    meta, dev = env.get("meta", {}), env.get("cupy_device") or {}
    gpu = meta.get("gpu") or {}
    lines = []
    if dev or gpu:
        lines.append(f"**{dev.get('name', gpu.get('name'))}**, compute capability "
                     f"{dev.get('compute_capability', gpu.get('compute_capability'))}, "
                     f"{dev.get('sm_count', gpu.get('sm_count'))} SMs, "
                     f"{dev.get('memory_gib', gpu.get('memory_gib'))} GiB, "
                     f"L2 {dev.get('l2_mib')} MiB; driver (CUDA) {_cuda_version(dev.get('driver'))}, runtime "
                     f"{_cuda_version(dev.get('runtime'))}, NVRTC {dev.get('nvrtc')}, cuDNN {gpu.get('cudnn')}  ")
    else:
        lines.append("No GPU (dry run or no device).  ")
    lines.append(f"cupyconv {meta.get('cupyconv')} ({meta.get('git_commit')}), CuPy {meta.get('cupy')}, torch "
                 f"{meta.get('torch')}, NumPy {meta.get('numpy')}, Python {meta.get('python')}; "
                 f"compute-sanitizer: {(env.get('compute_sanitizer') or {}).get('path')}; {meta.get('date')}  ")
    peaks = env.get("peaks") or {}
    if peaks:
        gemm = ", ".join(f"{k} {v['tflops']:.3g}" for k, v in peaks.get("gemm", {}).items())
        lines.append(f"Measured ({peaks.get('device')}): GEMM TFLOP/s {gemm}; copy {peaks['copy']['gbs']:.3g} GB/s "
                     f"(read + write)")
    for what, error in (env.get("errors") or {}).items():
        lines.append(f"- env error ({what}): {error}")
    return lines


def summary_pytest(check: Check, record: dict | None) -> list[str]:
    if record is None:
        return ["Not run."]
    xml = check.path("pytest.xml")
    if check.dry_run:
        return [f"Collected {record.get('collected')} GPU tests (not run: dry run)."]
    try:
        root = ElementTree.parse(xml).getroot()
    except (OSError, ElementTree.ParseError):
        return [f"No readable pytest.xml ({record['status']}); see pytest.log."]
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    lines = [f"**{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped** of "
             f"{n['tests']} ({record['status']}, {record['seconds']} s)."]
    reasons: dict = {}
    for case in root.iter("testcase"):
        for child in case.findall("skipped"):
            reason = (child.get("message") or "").strip().splitlines()
            reasons[reason[0][:200] if reason else "?"] = reasons.get(reason[0][:200] if reason else "?", 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda r: -r[1])[:3]:
        lines.append(f"- skipped {count}: {reason}")
    bad = [(case, child) for case in root.iter("testcase") for child in case if child.tag in ("failure", "error")]
    for case, child in bad[:25]:
        message = (child.get("message") or "").strip().splitlines()
        lines.append(f"- {child.tag}: `{case.get('classname')}::{case.get('name')}`: "
                     f"{message[0][:160] if message else ''}")
    if len(bad) > 25:
        lines.append(f"- ... and {len(bad) - 25} more (pytest.xml)")
    return lines


def summary_sanitizer(check: Check, record: dict | None) -> list[str]:
    if record is None:
        return ["Not run."]
    lines = [f"compute-sanitizer: {record['compute_sanitizer']}; {len(SANITIZER_TESTS)} tests; output in pytest.log, "
             "after the suite's."]
    if check.dry_run:
        lines.append(f"Collected {record.get('collected')} of the selection (not run: dry run).")
    for tool, r in record.get("tools", {}).items():
        lines.append(f"- {tool}: **{r['status']}**, sanitizer errors {r['sanitizer_errors']}, tests {r['tests']}, "
                     f"{r['seconds']} s")
    return lines


def summary_large(data) -> list[str]:
    if not data:
        return ["No large.json (see run.log)."]
    lines = [f"Path: {data['path']}; {data['samples_per_check']} random samples per check plus the first, last and "
             f"2^31 +- 1; passes if max |got - ref| / sum |terms| <= {data['tolerance']:.3g} and nothing non-finite"
             + ("" if data.get("complete") else " (**cut short**)") + ".", "",
             "| op | check | algorithm | x elements | out elements | max err / sum abs | rel L2 | non-finite | s "
             "| result |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in data["checks"]:
        err = c.get("max_err_over_sum_abs_terms")
        lines.append(f"| {c['op']} | {c['check']} | {c['algorithm']} | {c['x_elements']:,} | {c['out_elements']:,} | "
                     f"{'-' if err is None else f'{err:.2e}'} | "
                     f"{'-' if c.get('rel_l2') is None else format(c['rel_l2'], '.2e')} | {c.get('nonfinite', '-')} | "
                     f"{c.get('seconds', '-')} | {c['status'][:120]} |")
    return lines


def summary_bench(data, plotted: bool) -> list[str]:
    if not data:
        return ["No bench.json (see run.log)."]
    results = data.get("results", [])
    targets = [r for r in results if r.get("target_check")]
    met = sum(r["target_check"]["met"] for r in targets)
    errors = sum(e.get("status", "").startswith("error") for r in results for e in r["contenders"].values())
    lines = [f"{len(results)} case-passes measured (mode {data.get('mode')})"
             + ("" if data.get("complete") else ", **cut short**")
             + (f", {len(data['not_run'])} not started within the time limit" if data.get("not_run") else "")
             + f"; targets met {met} of {len(targets)}; contender errors {errors}."]
    peaks = (data.get("meta") or {}).get("peaks") or {}
    if peaks:
        gemm = ", ".join(f"{k} {v['tflops']:.3g}" for k, v in peaks.get("gemm", {}).items())
        lines.append(f"Peaks in the same process: GEMM TFLOP/s {gemm}; copy {peaks['copy']['gbs']:.3g} GB/s.")
    if targets:
        worst = sorted(targets, key=lambda r: r["target_check"]["ratio"] / r["target_check"]["target"], reverse=True)
        lines += ["", "Furthest from their targets (cupyconv time / alternative time):", "",
                  "| case | pass | cupyconv ms | alternative | ratio | target |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in worst[:12]:
            t, ours = r["target_check"], r["contenders"].get("cupyconv", {})
            lines.append(f"| {r['case']} | {r['pass']} | {ours.get('median_ms', float('nan')):.3f} | {t['vs']} | "
                         f"{t['ratio']:.2f}x | {t['target']:.3g}x {'met' if t['met'] else '**missed**'} |")
    lines += summary_autotune(data)
    lines += summary_timers(data)
    lines.append("All figures: `python -m benchmarks.report bench.json`; " + (
        "plotted in bench.png." if plotted else "no bench.png (no matplotlib here, or the step was cut short; see "
                                                "run.log): `python -m benchmarks.report --plot bench.json` draws it."))
    return lines


def _other_picks(picks) -> str:
    """The passes where autotuning kept another algorithm than the heuristic's pick ("-": none; an error as it came)."""
    if not isinstance(picks, list):
        return str(picks or "-")[:80]
    other = [f"{p['pass']} {p['algorithm']} (not {p['heuristic']})" for p in picks
             if p.get("algorithm") != p.get("heuristic")]
    return ", ".join(other) or "-"


def summary_autotune(data: dict) -> list[str]:
    """Autotuning on against off: benchmarks.run's "cupyconv (autotune)" against "cupyconv" (the default), and the
    profile step's host_profile with autotuning on next to its autotune-off figures of the same case-pass."""
    from .cases import AUTOTUNE
    lines = []
    pairs = [(r, r["contenders"].get("cupyconv", {}), r["contenders"][AUTOTUNE])
             for r in data.get("results", []) if r["contenders"].get(AUTOTUNE, {}).get("median_ms")]
    pairs = [(r, off, on) for r, off, on in pairs if off.get("median_ms")]
    if pairs:
        pairs.sort(key=lambda p: p[2]["median_ms"] / p[1]["median_ms"], reverse=True)
        lines += ["", f"Autotuning on against off (the default), in the same rounds ({len(pairs)} case-passes, "
                      "the 12 where it costs most):", "",
                  "| case | pass | off ms | on ms | on / off | autotune kept, where not the heuristic's pick |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['case']} | {r['pass']} | {off['median_ms']:.3f} | {on['median_ms']:.3f} | "
                  f"{on['median_ms'] / off['median_ms']:.2f} | {_other_picks(on.get('picks'))} |"
                  for r, off, on in pairs[:12]]
    tuned, profile = data.get("profile_autotune") or {}, data.get("profile") or {}
    if tuned:
        lines += ["", "host_profile, autotuning off -> on (us per call):", "",
                  "| case-pass | host | wall | kernels | autotune kept, where not the heuristic's pick |",
                  "| --- | --- | --- | --- | --- |"]
        for name, on in tuned.items():
            off = profile.get(name, {})
            cells = [" -> ".join(f"{r[k]:.1f}" if k in r else "-" for r in (off, on))
                     for k in ("host_us", "wall_us", "kernel_us")]
            lines.append(f"| {name} | {' | '.join(cells)} | "
                         f"{on['error'] if 'error' in on else _other_picks(on.get('autotune_picks'))} |")
    return lines


def summary_timers(data: dict) -> list[str]:
    """host_profile's figures beside the benchmark's own timer on the same call (`host_profile.benchmark_timer_us`):
    the first H100 run had r50-64 fp16 fwd at 186.6 us in the benchmark and 133.0 us wall in host_profile."""
    rows = [(name, r) for name, r in (data.get("profile") or {}).items() if "benchmark_timer" in r]
    if not rows:
        return []
    queued = rows[0][1]["benchmark_timer"]["queued_calls"]
    lines = ["", f"The benchmark's timer (CUDA events around {queued} queued calls) on host_profile's calls, alone and "
                 "interleaved with the baseline's turns (us per call, autotuning off):", "",
             "| case-pass | host (no sync) | wall (sync at end) | benchmark timer, alone | interleaved |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in rows:
        t = r["benchmark_timer"]
        lines.append(f"| {name} | {r['host_us']:.1f} | {r['wall_us']:.1f} | {t['alone_us']:.1f} | "
                     f"{t['interleaved_us']:.1f} ({t['baseline']}) |")
    return lines


def calibrate(check: Check) -> dict:
    """The model's error on this run: the benchmarks' measurements (bench.json) against the predictions of record
    for this GPU (`predict.PREDICTIONS`); each measured result of bench.json gets its "prediction" too (the file
    is rewritten).  A dry run compares its CPU smoke times with the H100 predictions, which only checks the code."""
    from . import calibrate as calibrate_mod
    from . import predict
    env, bench = _read_json(check.path("env.json")) or {}, _read_json(check.path("bench.json"))
    profile = _read_json(profile_json(check))
    profile_json(check).unlink(missing_ok=True)
    autotuned = _read_json(profile_json(check, autotune=True))
    profile_json(check, autotune=True).unlink(missing_ok=True)
    if profile is not None and bench is None:   # keep it, in the one file every run writes to
        with open(check.path("run.log"), "a") as log:
            log.write(f"host_profile (autotune off, {PROFILE_CALLS} calls): {json.dumps(profile)}\n")
    if autotuned is not None and bench is None:
        with open(check.path("run.log"), "a") as log:
            log.write(f"host_profile (autotune on, {PROFILE_CALLS} calls): {json.dumps(autotuned)}\n")
    device = (env.get("cupy_device") or {}).get("name") or ((env.get("meta") or {}).get("gpu") or {}).get("name")
    gpu = "h100" if check.dry_run else predict.gpu_of(device)
    if bench is None and profile is None:
        return {"status": "no bench.json and no profile"}
    if gpu is None:
        return {"status": f"the model has no constants for {device!r} (it models {', '.join(predict.GPUS)})"}
    predictions = _read_json(predict.PREDICTIONS[gpu])
    if predictions is None:
        return {"status": f"no predictions file {predict.PREDICTIONS[gpu].name}"}
    kernel_rows = calibrate_mod.calibrate({"profile": profile}, predictions) if profile else []
    stale = predictions["meta"].get("kernels_sha") != predict.kernels_hash()
    if bench is None:
        return {"status": "ok", "gpu": gpu, "rows": [], "kernel_rows": kernel_rows, "stale": stale,
                "meta": predictions["meta"], "no_bench": True}
    if profile is not None:
        bench["profile"] = profile
        bench["profile_settings"] = {"autotune": "off", "calls": PROFILE_CALLS, "cases": list(PROFILE_CASES),
                                     "dry_run": check.dry_run}
    if autotuned is not None:   # the same with autotuning on, apart: the calibration is of the model's plan
        bench["profile_autotune"] = autotuned
        bench.setdefault("profile_settings", {})["autotune_on_cases"] = list(PROFILE_AUTOTUNE_CASES)
    rows = predict.calibration(bench, predictions)
    by_key = {(row["case"], row["pass"]): row for row in rows}
    for result in bench.get("results", []):
        row = by_key.get((result["case"], result["pass"]))
        if row:
            result["prediction"] = {**row, "predictions_commit": predictions["meta"].get("git_commit")}
    check.path("bench.json").write_text(json.dumps(bench, indent=1, default=str) + "\n")
    return {"status": "ok", "gpu": gpu, "rows": rows, "kernel_rows": kernel_rows, "stale": stale,
            "meta": predictions["meta"]}


def summary_calibration(check: Check, record: dict) -> list[str]:
    if record.get("status") != "ok":
        return [f"Not calibrated: {record.get('status')}."]
    rows, meta = record["rows"], record["meta"]
    lines = [f"Predictions of record: benchmarks/results/predict-{record['gpu']}.json (commit {meta.get('git_commit')}, "
             f"{meta.get('gpu_constants', {}).get('name')})"
             + ("; **the kernels changed since** (another raw_kernels/ hash): re-run "
                f"`python -m benchmarks.predict --gpu {record['gpu']}` at this commit before reading the error"
                if record["stale"] else "") + "."]
    if check.dry_run:
        lines.append("Dry run: the measured figures are CPU smoke times of tiny shapes and 0 us for kernels that "
                     "were recorded, not run, so the ratios below mean nothing; this only checks the code.")
    kernel_rows = record.get("kernel_rows") or []
    lines += ["", "### Kernels: MEASURED GPU time (host_profile, CUPTI) against PREDICTED", ""]
    if kernel_rows:
        from . import calibrate as calibrate_mod
        lines += ["Each kernel's own GPU time per call, autotuning off (the model's plan), matched with its "
                  "predicted launches by `benchmarks.calibrate`: against each launch's `kernel_us` where the "
                  "predictions give it, else its predicted_us, which adds 1.5-4 us of launch overhead that CUPTI "
                  "does not time.", "",
                  calibrate_mod.markdown(kernel_rows, calibrate_mod.summary(kernel_rows))]
    else:
        lines.append("No profile (see the profile step in run.log).")
    lines += ["", "### Case-passes: MEASURED wall time (host + GPU, benchmarks.run) against PREDICTED wall time", ""]
    if record.get("no_bench"):
        return lines + ["No bench.json."]
    if not rows:
        return lines + ["No measured case-pass has a prediction."]

    def middle(pair):
        return math.sqrt(pair[0] * pair[1])

    ratios = sorted(middle(r["measured_over_wall"]) for r in rows)
    inside = sum(r["inside_wall"] for r in rows)
    host_model = all(r.get("host_us") for r in rows)
    lines += ["Calls queued back to back take max(GPU time, host time) each: the predicted wall time is the larger "
              "of the predicted kernels (GPU) and the predicted host time (Python calls and launches counted on the "
              "CPU by benchmarks.host_overhead, with constants fitted to each GPU machine's measured host times: "
              "benchmarks.predict HOST_MODELS)."
              + ("" if host_model else " **These predictions have no host model** (made before it): their wall "
                 "time is the GPU's alone, and host-bound calls measure far above it."), "",
              f"{inside} of {len(rows)} measurements inside the predicted wall range; measured / predicted wall "
              f"(geometric middle of the range): median {ratios[len(ratios) // 2]:.2f}x, from {ratios[0]:.2f}x to "
              f"{ratios[-1]:.2f}x.", "",
              "| case | pass | MEASURED wall us (host + GPU) | PREDICTED GPU us | PREDICTED host us | PREDICTED wall us | "
              "measured / predicted wall | bound (predicted) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def span(pair):
        return f"{pair[0]:.0f}-{pair[1]:.0f}" if pair else "n/a"

    for r in rows:
        lo, hi = r["measured_over_wall"]
        lines.append(f"| {r['case']} | {r['pass']} | {r['measured_us']:.1f} | {span(r['predicted_us'])} | "
                     f"{span(r.get('host_us'))} | {span(r['wall_us'])} | "
                     f"{hi:.2f}-{lo:.2f}{'' if r['inside_wall'] else ' **outside**'} | {r['bound']} |")
    return lines


def summarize(check: Check, records: dict) -> str:
    title = "cupyconv GPU check" + (" (dry run: nothing ran on a GPU)" if check.dry_run else "")
    lines = [f"# {title}", "", f"`python -m benchmarks.gpu_check {' '.join(sys.argv[1:])}`, "
             f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, budget "
             f"{check.budget_s:.0f} s, {time.perf_counter() - check.t0:.0f} s used", "",
             *summary_env(_read_json(check.path("env.json"))), "", "## Steps", "",
             "| step | status | seconds | limit |", "| --- | --- | --- | --- |"]
    for name in STEPS:
        r = records.get(name)
        row = (r["status"], r.get("seconds", "-"), r["limit_s"]) if r else ("not run (--steps)", "-", "-")
        lines.append("| {} | {} | {} | {} |".format(name, *row))
    lines += ["", "## Tests (pytest -m gpu)", "", *summary_pytest(check, records.get("pytest")),
              "", "## Sanitizers", "", *summary_sanitizer(check, records.get("sanitizer")),
              "", "## Above 2^31 elements (fp16)", "", *summary_large(_read_json(check.path("large.json"))),
              "", "## Benchmarks", "",
              *summary_bench(_read_json(check.path("bench.json")), check.path("bench.png").exists()),
              "", "## Model calibration (benchmarks.predict: predicted before the run, measured here)", "",
              *summary_calibration(check, records.get("calibration") or {"status": "not run"}),
              "", "Files: " + ", ".join(f"{p.name} ({p.stat().st_size:,} B)" for p in sorted(check.out.iterdir()))
              + " and this summary.md"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Command line


def prepare_out(parser, out: Path) -> None:
    """--out must be a folder that is new, empty or holds only an earlier run's files (removed here)."""
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: is a file; give a folder (it is created if missing)")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name.removesuffix(".partial") not in OUTPUT_FILES)
        if foreign:
            parser.error(f"--out {out}: holds other files ({', '.join(foreign[:5])}); give a new or empty folder, "
                         f"as the run writes exactly {', '.join(OUTPUT_FILES)}")
        for name in OUTPUT_FILES:
            (out / name).unlink(missing_ok=True)
            (out / f"{name}.partial").unlink(missing_ok=True)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--out {out}: cannot create it: {e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results (at most 8 files)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S}); every step's limit scales "
                             "with it")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU needed: collect the tests, run the large-case checks on tiny shapes and the "
                             "benchmark smoke on the CPU, write the same files")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    parser.add_argument("--worker", choices=("env", "large"), help=argparse.SUPPRESS)   # one step, in its subprocess
    args = parser.parse_args(argv)
    if args.worker:
        return {"env": worker_env, "large": worker_large}[args.worker](args.out, args.dry_run)

    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        parser.error(f"--steps: {', '.join(unknown) or 'none given'}; choose from {', '.join(STEPS)}")
    if not args.budget >= 60:
        parser.error(f"--budget {args.budget:g}: give at least 60 seconds")
    out = args.out.resolve()   # the steps run in the checkout's root, wherever this was started
    prepare_out(parser, out)
    check = Check(out, args.dry_run, args.budget, time.perf_counter())

    print(f"cupyconv GPU check{' (dry run)' if check.dry_run else ''}: budget {check.budget_s:.0f} s, "
          f"results in {check.out}")
    scale = check.budget_s / DEFAULT_BUDGET_S
    for i, name in enumerate(STEPS, 1):
        limit = f"{STEP_S[name] * scale:5.0f} s" if name != "bench" else f">={BENCH_S * scale:4.0f} s"
        print(f"  {i}. {name:<10} {limit}  {STEP_TEXT[name][check.dry_run]}" + ("" if name in steps else "  (skipped)"))
    records = {}
    for name in (s for s in STEPS if s in steps):
        limit = check.limit(name)
        print(f"[{name}] limit {limit:.0f} s ...", flush=True)
        try:
            record = STEP_FUNCTIONS[name](check, limit)
        except Exception as e:   # a bug here must not cost the other steps
            record = {"status": f"error: {type(e).__name__}: {e}", "seconds": 0.0}
        record["limit_s"] = round(limit)
        records[name] = record
        print(f"[{name}] {record['status']} in {record.get('seconds', 0):.0f} s", flush=True)
    for leftover in check.out.glob("*.partial"):   # a worker killed while writing its JSON
        leftover.unlink()
    try:
        calibration = calibrate(check)
    except Exception as e:   # a bug here must not cost the summary
        calibration = {"status": f"error: {type(e).__name__}: {e}"}
    records_for_summary = {**records, "calibration": calibration}
    text = summarize(check, records_for_summary)
    check.path("summary.md").write_text(text)
    print("\n" + text, end="")
    return 0 if all(r["status"] in ("ok", "not found") for r in records.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
