"""Benchmark cupyconv against the alternatives a user would pick, in the same run.

    python -m benchmarks.run --device cpu --json bench.json          # the CPU cases (i)-(iv)
    python -m benchmarks.run --device gpu --json bench-gpu.json      # CuPy arrays and torch CUDA tensors
    python -m benchmarks.run --cases ii,iv --quick                   # a subset, fewer samples
    python -m benchmarks.run --smoke                                 # tiny shapes: checks the harness runs

    python -m benchmarks.run --device gpu --cases issue11 --json x.json   # a tag: issue 11's tensor-core cases
    python -m benchmarks.run --device gpu --quick --time-limit 300       # start no new case after 300 s

For every case and pass (forward; forward + backward) each contender first runs once and its outputs are
checked against the baseline's; then the contenders are timed in interleaved rounds (one call each per round,
the order rotated every round), so load from elsewhere on the machine falls on all of them alike.  A case's
figures are the median over rounds; ratios are cupyconv's median / the alternative's median (below 1: cupyconv
is faster), with the median of the per-round ratios beside it as a check on noise.  On the GPU the figure is the
GPU time of queued work (CUDA events around a turn's calls enqueued back to back, divided by their count) and
`latency_median_ms` beside it the end-to-end latency of one synchronised call; each result's "timing" says so
(benchmarks/timing.py).

Precision: every case runs with TF32 exactly as its `tf32` field says, on both sides (cupyconv.settings.allow_tf32,
torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32), restored after; the state is recorded
per case.  Roofline (GPU; on the CPU only under --smoke, to exercise the code): once per process, before the
cases, a large dense GEMM (torch.matmul, n = 8192) in each dtype the cases need (TF32 allowed for "tf32") and a
large device-to-device copy are timed with the cases' own timer; each case then reports its achieved TFLOP/s,
the fraction of that GEMM peak, and its floor max(FLOPs / peak, floor bytes / copy bandwidth).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy

from . import cases as cases_mod
from . import plot, report
from .timing import TIMING, CudaTimer, Samples, time_cpu

ROOT = Path(__file__).resolve().parents[1]

# warmup: untimed calls before timing; rounds: minimum and maximum number of rounds; budget_s: seconds spent per
# case and pass (gaps included) after which no new round starts once the minimum is done; gap_s: idle time
# before each contender's turn in a round (CPU: longer than the time OpenBLAS and OpenMP worker threads spin
# after a call, about 0.1 s for OpenBLAS, so one library's spinning threads never slow the next contender);
# burst_s: each turn times enough back-to-back calls to take about this long (after one untimed call).
SETTINGS = {
    "cpu": {
        "full": dict(warmup=2, min_rounds=7, max_rounds=40, budget_s=8.0, gap_s=0.15, burst_s=0.1, max_burst=20),
        "quick": dict(warmup=1, min_rounds=3, max_rounds=10, budget_s=2.0, gap_s=0.15, burst_s=0.05, max_burst=5),
        "smoke": dict(warmup=1, min_rounds=2, max_rounds=2, budget_s=0.0, gap_s=0.0, burst_s=0.0, max_burst=1),
    },
    "gpu": {
        "full": dict(warmup=10, min_rounds=20, max_rounds=400, budget_s=4.0, gap_s=0.0, burst_s=0.01, max_burst=50),
        "quick": dict(warmup=5, min_rounds=10, max_rounds=100, budget_s=1.0, gap_s=0.0, burst_s=0.005,
                      max_burst=20),
        "smoke": dict(warmup=2, min_rounds=2, max_rounds=2, budget_s=0.0, gap_s=0.0, burst_s=0.0, max_burst=1),
    },
}
QUIET_PCT = 10.0  # other processes' share of the CPUs under which the machine counts as quiet


def wait_for_quiet(max_wait_s: float) -> float:
    """Sleep in 1 s probes until other processes use less than QUIET_PCT of the CPUs; returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait_s:
        meter = _LoadMeter()
        time.sleep(1.0)
        busy = meter.others_pct()
        if busy is None or busy < QUIET_PCT:
            break
    return time.perf_counter() - t0


TOLERANCE = {"float32": 1e-3, "float64": 1e-9, "float16": 2e-2, "bfloat16": 5e-2,
             "tf32": 5e-3}  # TF32 on both sides: two 10-bit-mantissa products against each other

# The roofline's reference measurements (once per process): the GEMM's n (n x n @ n x n), the copy's bytes, and
# the untimed and timed calls of each.
PEAK_SIZES = {
    "gpu": {"full": dict(n=8192, copy_bytes=2**30, warmup=3, calls=10),
            "quick": dict(n=8192, copy_bytes=2**30, warmup=2, calls=5),
            "smoke": dict(n=1024, copy_bytes=2**26, warmup=1, calls=2)},
    "cpu": {"smoke": dict(n=128, copy_bytes=2**22, warmup=1, calls=2)},
}


# ---------------------------------------------------------------------------------------------------------
# Environment


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (commit + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def _blas() -> str | None:
    try:
        config = numpy.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:
        return None


def _blas_threads() -> int | None:
    """The thread count of NumPy's bundled OpenBLAS, read through its C API."""
    import ctypes
    import glob
    libs = glob.glob(str(Path(numpy.__file__).parent.parent / "numpy.libs" / "libscipy_openblas*.so"))
    for lib in libs:
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for symbol in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads"):
            if hasattr(handle, symbol):
                return int(getattr(handle, symbol)())
    return None


def environment(device: str) -> dict:
    import cupyconv
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.run " + " ".join(sys.argv[1:]),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numpy_blas": _blas(),
        "cupyconv": cupyconv.__version__,
        "git_commit": _git_commit(),
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
                       if k in os.environ},
        "numpy_blas_threads": _blas_threads(),
    }
    try:
        import torch
        meta["torch"] = torch.__version__
        meta["torch_threads"] = torch.get_num_threads()
    except ImportError:
        meta["torch"] = None
    try:
        import cupy
        meta["cupy"] = cupy.__version__
    except ImportError:
        meta["cupy"] = None
    if device == "gpu":
        import torch
        props = torch.cuda.get_device_properties(0)
        meta["gpu"] = {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "tf32": {"cuda_matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32,
                     "CUPY_TF32": os.environ.get("CUPY_TF32", "0"),
                     "note": "the default of the run; each case's own state is in its result's 'tf32'"},
            "sm_count": props.multi_processor_count,
        }
        if hasattr(cupyconv, "get_allow_tf32"):
            meta["gpu"]["tf32"]["cupyconv"] = cupyconv.get_allow_tf32()
        meta["gpu"]["cupyconv_autotune"] = {"cupyconv": "off (the library's default)",
                                            cases_mod.AUTOTUNE: "on (its picks: each result's contender 'picks')"}
        if meta["cupy"]:
            import cupy
            meta["gpu"]["cupy_cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
            meta["gpu"]["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
    return meta


def setup_gpu() -> None:
    """torch as a user tuning for speed would set it, with strict fp32 (no TF32) on both libraries; cupyconv as it
    comes (autotuning off: the "cupyconv" contender is the library's default and the model's plan), its autotuning
    timed apart by the "cupyconv (autotune)" contender (`cases.AUTOTUNE`)."""
    import torch
    if not torch.cuda.is_available():
        sys.exit("benchmarks: --device gpu needs torch with CUDA and a visible GPU")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("CUPY_TF32", "0")
    import cupyconv
    # cupyconv's counterpart of cudnn.benchmark is a contender of its own (cases.AUTOTUNE); strict fp32 on its side
    if hasattr(cupyconv, "set_autotune"):
        cupyconv.set_autotune(False)
    if hasattr(cupyconv, "set_allow_tf32"):
        cupyconv.set_allow_tf32(False)


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def precision_state() -> dict:
    """Whether each library may run float32 on TF32 tensor cores right now."""
    import cupyconv
    state = {"cupyconv": cupyconv.settings.get_allow_tf32()}
    torch = _torch()
    if torch is not None:
        state["torch_cudnn"] = torch.backends.cudnn.allow_tf32
        state["torch_cuda_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return state


@contextlib.contextmanager
def precision(tf32: bool):
    """TF32 allowed (tf32=True) or strict fp32 on both sides for the block: cupyconv's allow_tf32,
    torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32 (the unfold+matmul contender, and
    the GEMM peak); all three are restored after.  Yields the state inside.

    cupyconv's is set process-wide (settings.set_allow_tf32), not with its `allow_tf32` context manager: that one
    holds for the current thread only, and torch runs the backward of CUDA tensors (cupyconv.torch's autograd
    Functions included) in its own device threads.

    cupyconv's autotune cache (cupyconv._autotune.CACHE) is keyed by pass, geometry, dtype and device but not by
    TF32, so a strict-fp32 choice would be reused under TF32 (never trying the tensor cores) and a TF32 choice
    ('implicit_gemm') would fail under strict fp32: it is emptied when a TF32 block starts and when it ends."""
    import cupyconv
    torch = _torch()
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) if torch else None
    saved_cupyconv = cupyconv.settings.get_allow_tf32()
    cache = getattr(getattr(cupyconv, "_autotune", None), "CACHE", None)
    if tf32 and cache is not None:
        cache.clear()
    try:
        if torch is not None:
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
        cupyconv.settings.set_allow_tf32(tf32)
        yield precision_state()
    finally:
        cupyconv.settings.set_allow_tf32(saved_cupyconv)
        if torch is not None:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
        if tf32 and cache is not None:
            cache.clear()


def measure_peaks(keys, device: str, mode: str, log) -> dict | None:
    """The roofline's references, timed like the cases (CudaTimer on the GPU, median of several calls):
    a dense n x n x n torch.matmul in each key's dtype ("tf32": float32 with TF32 allowed; "float32": strict)
    and a device-to-device copy (bandwidth = bytes read + bytes written, per second)."""
    sizes = PEAK_SIZES.get(device, {}).get(mode)
    torch = _torch()
    if sizes is None or torch is None or not keys:
        return None
    where = "cuda" if device == "gpu" else "cpu"
    timer = CudaTimer("torch") if device == "gpu" else time_cpu
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
              "tf32": torch.float32, "float64": torch.float64}

    def timed(fn) -> dict:
        for _ in range(sizes["warmup"]):
            timer(fn)
        samples = Samples()
        for _ in range(sizes["calls"]):
            samples.add(timer(fn))
        return samples.summary()

    n = sizes["n"]
    out = {"method": f"torch.matmul ({n} x {n}) @ ({n} x {n}), out= preallocated; tensor copy_ of "
                     f"{sizes['copy_bytes']} bytes; {sizes['calls']} timed calls after {sizes['warmup']}, median",
           "device": device, "gemm": {},
           "torch_matmul_flags": {name: getattr(torch.backends.cuda.matmul, name, None) for name in
                                  ("allow_fp16_reduced_precision_reduction",
                                   "allow_bf16_reduced_precision_reduction")}}
    generator = torch.Generator(device=where).manual_seed(0)
    for key in sorted(set(keys)):
        a = torch.randn(n, n, device=where, generator=generator).to(dtypes[key])
        b = torch.randn(n, n, device=where, generator=generator).to(dtypes[key])
        c = torch.empty(n, n, device=where, dtype=dtypes[key])
        with precision(key == "tf32") as state:
            summary = timed(lambda: torch.matmul(a, b, out=c))
        out["gemm"][key] = {"n": n, "tflops": 2 * n ** 3 / (summary["median_ms"] / 1e3) / 1e12,
                            "median_ms": summary["median_ms"], "iqr_pct": summary["iqr_pct"], "tf32": state}
        del a, b, c
    src = torch.empty(sizes["copy_bytes"], dtype=torch.uint8, device=where).fill_(1)
    dst = torch.empty_like(src)
    summary = timed(lambda: dst.copy_(src))
    out["copy"] = {"bytes": sizes["copy_bytes"], "gbs": 2 * sizes["copy_bytes"] / (summary["median_ms"] / 1e3) / 1e9,
                   "median_ms": summary["median_ms"], "iqr_pct": summary["iqr_pct"]}
    del src, dst
    if device == "gpu":
        torch.cuda.empty_cache()
    log("peaks (same process): " + ", ".join(f"{k} GEMM {v['tflops']:.1f} TFLOP/s" for k, v in out["gemm"].items())
        + f"; copy {out['copy']['gbs']:.0f} GB/s (read + write)")
    return out


class _LoadMeter:
    """CPU time used by every other process on the machine while we measure, from /proc/stat and os.times().

    others_pct is the busy time of all CPUs minus this process's own CPU time, as a percentage of the CPU time
    available (wall time x usable CPUs): 0 on a quiet machine, 100 if others kept every core busy.
    """

    def __init__(self):
        self.t0, self.busy0, self.own0 = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy():
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own():
        t = os.times()
        return t.user + t.system

    def others_pct(self) -> float | None:
        busy = self._busy()
        if busy is None or self.busy0 is None:
            return None
        wall = time.perf_counter() - self.t0
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        others = (busy - self.busy0) - (self._own() - self.own0)
        return max(0.0, round(100 * others / (wall * cpus), 1))


# ---------------------------------------------------------------------------------------------------------
# Measuring one case and pass


def _max_rel_err(outputs, reference) -> float:
    """Largest |a - b| over each output, relative to the largest |b| of that output."""
    worst = 0.0
    for a, b in zip(outputs, reference):
        a, b = cases_mod.to_numpy(a), cases_mod.to_numpy(b)
        if a.shape != b.shape:
            return float("inf")
        scale = max(float(numpy.abs(b).max(initial=0.0)), 1e-12)
        worst = max(worst, float(numpy.abs(a - b).max(initial=0.0)) / scale)
    return worst


def measure(case: cases_mod.Case, backward: bool, mode: str, log, peaks: dict | None = None,
            peak_target: float | None = None) -> dict:
    """One case and pass, with TF32 on or off on both sides as the case says (`precision`)."""
    with precision(case.tf32) as state:
        result = _measure(case, backward, mode, peaks, peak_target)
    result["tf32"] = state
    log(format_result(result))
    return result


def _measure(case: cases_mod.Case, backward: bool, mode: str, peaks: dict | None, peak_target: float | None) -> dict:
    cfg = SETTINGS[case.device][mode]
    inputs = cases_mod.make_inputs(case)
    contenders = cases_mod.contenders_for(case)
    baseline = cases_mod.baseline_for(case)
    result = {"case": case.label, "name": case.name, "op": case.op, "tags": list(case.tags), "dims": case.dims,
              "device": case.device, "dtype": case.dtype, "precision": case.precision,
              "pass": "fwd+bwd" if backward else "fwd",
              "target": case.target_for(backward), "target_vs": case.target_vs, "baseline": baseline.name,
              "timing": TIMING[case.device], "contenders": {}, "ratios": {}}

    runnable = {}
    reference = None
    # The baseline runs first so the others can be checked against it.
    for c in sorted(contenders, key=lambda c: c is not baseline):
        entry = result["contenders"].setdefault(c.name, {"ours": c.ours})
        try:
            fn = c.build(case, inputs, backward)
            outputs = fn()
        except NotImplementedError as e:
            entry["status"] = f"not implemented: {e}"
            continue
        except Exception as e:  # recorded, reported, and makes the run exit non-zero
            entry["status"] = f"error: {type(e).__name__}: {e}"
            continue
        if c.name == cases_mod.AUTOTUNE:   # what autotuning picked in each pass, against the heuristic's pick
            from . import launches
            try:
                entry["picks"] = launches.autotune_picks(fn)
            except Exception as e:   # the picks are a note: the timing goes on without them
                entry["picks"] = f"error: {type(e).__name__}: {e}"
        if c is baseline:
            reference = outputs
        elif reference is not None:
            err = _max_rel_err(outputs, reference)
            entry["max_rel_err_vs_baseline"] = err
            if not err <= TOLERANCE["tf32" if case.tf32 else case.dtype]:
                entry["status"] = f"error: outputs differ from {baseline.name} (max rel err {err:.3g})"
        entry.setdefault("status", "ok")
        runnable[c.name] = (c, fn)

    timers, bursts = {}, {}
    for name, (c, fn) in runnable.items():
        timer = timers[name] = time_cpu if case.device == "cpu" else CudaTimer(c.library)
        estimate = None
        for _ in range(max(cfg["warmup"], 1)):
            estimate = timer(fn)["s"]
        bursts[name] = max(1, min(cfg["max_burst"], math.ceil(cfg["burst_s"] / max(estimate, 1e-9))))

    samples = {name: Samples() for name in runnable}
    rounds = []
    names = list(runnable)
    load = _LoadMeter()
    t_start = time.perf_counter()
    r = 0
    while names and r < cfg["max_rounds"] and (r < cfg["min_rounds"] or time.perf_counter() - t_start < cfg["budget_s"]):
        order = names[r % len(names):] + names[:r % len(names)]
        this_round = {}
        for name in order:
            fn = runnable[name][1]
            if cfg["gap_s"]:
                time.sleep(cfg["gap_s"])
                fn()  # wakes the library's worker threads; untimed
            if case.device == "cpu":   # one call per sample
                burst = [timers[name](fn) for _ in range(bursts[name])]
            else:   # one sample: the GPU time of the turn's calls, queued, and one call's latency
                burst = [timers[name](fn, bursts[name])]
            for sample in burst:
                samples[name].add(sample)
            this_round[name] = statistics.median(sample["s"] for sample in burst)
        rounds.append(this_round)
        r += 1
    result["rounds"] = r
    result["calls_per_turn"] = bursts
    result["others_cpu_pct"] = load.others_pct()

    for name in runnable:
        result["contenders"][name].update(samples[name].summary())
    ours = [n for n in runnable if runnable[n][0].ours]
    others = [n for n in runnable if not runnable[n][0].ours]
    for o in ours:
        result["ratios"][o] = {}
        for a in others:
            med_o = result["contenders"][o]["median_ms"]
            med_a = result["contenders"][a]["median_ms"]
            result["ratios"][o][a] = {
                "ratio_of_medians": med_o / med_a,
                "median_round_ratio": statistics.median(rd[o] / rd[a] for rd in rounds),
            }
    target = case.target_for(backward)
    vs = baseline.name if case.target_vs == "baseline" else fastest_alternative(result)
    if target is not None and vs in result["ratios"].get("cupyconv", {}):
        ratio = result["ratios"]["cupyconv"][vs]["ratio_of_medians"]
        result["target_check"] = {"vs": vs, "rule": case.target_vs, "ratio": ratio, "target": target,
                                  "met": ratio <= target}
    add_roofline(case, backward, result, peaks)
    check = peak_check(case, result, peak_target)
    if check:
        result["peak_check"] = check
    return result


def fastest_alternative(result: dict) -> str | None:
    """The non-cupyconv contender with the lowest median among those that ran correctly."""
    times = {name: e["median_ms"] for name, e in result["contenders"].items()
             if not e.get("ours") and e.get("status") == "ok" and "median_ms" in e}
    return min(times, key=times.get) if times else None


def add_roofline(case: cases_mod.Case, backward: bool, result: dict, peaks: dict | None) -> None:
    """result["roofline"]: FLOPs, floor bytes, and with measured peaks the floor time; each timed contender's
    entry["roofline"]: its achieved TFLOP/s, fraction of the GEMM peak and time as a multiple of the floor."""
    key = cases_mod.peak_key(case)
    peak = ((peaks or {}).get("gemm") or {}).get(key)
    copy = (peaks or {}).get("copy")
    peak_flops = peak["tflops"] * 1e12 if peak else None
    bandwidth = copy["gbs"] * 1e9 if copy else None
    result["roofline"] = {**cases_mod.roofline(case, backward, None, peak_flops, bandwidth), "peak_key": key,
                          "peak_tflops": peak["tflops"] if peak else None, "copy_gbs": copy["gbs"] if copy else None}
    for entry in result["contenders"].values():
        if "median_ms" in entry:
            r = cases_mod.roofline(case, backward, entry["median_ms"] / 1e3, peak_flops, bandwidth)
            entry["roofline"] = {k: r[k] for k in ("tflops", "gbs", "peak_fraction", "x_floor") if k in r}


def peak_check(case: cases_mod.Case, result: dict, target: float | None) -> dict | None:
    """Issue 11's >= target fraction of the measured GEMM peak, for cupyconv on the compute-bound tensor-core cases
    of conv2d and patch (compute-bound: FLOPs / peak >= floor bytes / copy bandwidth)."""
    roof = result.get("roofline", {})
    ours = result["contenders"].get("cupyconv", {}).get("roofline", {})
    if (target is None or not case.tensor_cores or case.op not in cases_mod.PEAK_TARGET_OPS
            or roof.get("floor_bound") != "compute" or ours.get("peak_fraction") is None):
        return None
    return {"fraction": ours["peak_fraction"], "target": target, "met": ours["peak_fraction"] >= target,
            "peak_key": roof["peak_key"], "peak_tflops": roof["peak_tflops"]}


# ---------------------------------------------------------------------------------------------------------
# Output


def _fmt_tflops(value) -> str:
    return f"{value:.1f}" if value is not None and value >= 1 else f"{value:.3f}" if value is not None else "-"


def format_roofline(res: dict) -> str:
    """One line: FLOPs, floor bytes, and (with peaks) the floor time and what bounds it."""
    r = res.get("roofline")
    if not r:
        return ""
    text = f"  roofline: {r['flops'] / 1e9:.3f} GFLOP, {r['bytes'] / 1e6:.2f} MB floor"
    if r.get("floor_ms") is not None:
        text += (f", floor {r['floor_ms'] * 1e3:.1f} us ({r['floor_bound']}-bound) at the {r['peak_key']} GEMM's "
                 f"{r['peak_tflops']:.1f} TFLOP/s and {r['copy_gbs']:.0f} GB/s copy")
    return text


def format_result(res: dict) -> str:
    ours = list(res["ratios"])
    gpu = res.get("device") == "gpu"
    tf32 = res.get("tf32", {})
    lines = [f"  {res['pass']}: {res.get('rounds', 0)} rounds, calls per turn {res.get('calls_per_turn')}, "
             f"other processes used {res.get('others_cpu_pct')}% of the CPUs meanwhile; TF32 "
             + ", ".join(f"{k} {'on' if v else 'off'}" for k, v in tf32.items())]
    if res.get("timing"):   # what the columns are (benchmarks/timing.py TIMING)
        labels = {"median_ms": "GPU ms" if gpu else "median ms", "latency_median_ms": "latency ms"}
        shown = res["timing"] if gpu else {"median_ms": res["timing"]["median_ms"]}
        lines.append("  " + "; ".join(f"{labels[key]}: {text}" for key, text in shown.items()))
    if res.get("roofline"):
        lines.append(format_roofline(res))
    head = (f"  {'pass':<8} {'contender':<44} {('GPU ms' if gpu else 'median ms'):>10} {'IQR %':>6} {'n':>4} "
            f"{'TFLOP/s':>8} {'% peak':>7} {('latency ms' if gpu else ''):>10}")
    short = {"cupyconv": "cupyconv", cases_mod.AUTOTUNE: "cc.autotune"}
    head += "".join(f" {short.get(o, 'cc.torch') + ' / it':>16}" for o in ours)
    lines.append(head)
    for name, entry in res["contenders"].items():
        if entry.get("status", "ok") != "ok" and "median_ms" not in entry:
            lines.append(f"  {res['pass']:<8} {name:<44} {entry['status'][:90]}")
            continue
        roof = entry.get("roofline", {})
        fraction = roof.get("peak_fraction")
        row = (f"  {res['pass']:<8} {name:<44} {entry['median_ms']:>10.3f} {entry['iqr_pct']:>6.1f} {entry['n']:>4}"
               f" {_fmt_tflops(roof.get('tflops')):>8} {(f'{100 * fraction:.1f}' if fraction is not None else '-'):>7}"
               f" {(format(entry['latency_median_ms'], '10.3f') if gpu and 'latency_median_ms' in entry else ''):>10}")
        for o in ours:
            ratio = res["ratios"][o].get(name)
            row += f" {ratio['ratio_of_medians']:>15.2f}x" if ratio else f" {'':>16}"
        if name == res.get("target_check", {}).get("vs"):
            t = res["target_check"]
            row += (f"   target <= {t['target']:g}x" + (" (the fastest alternative)" if t.get("rule") == "best" else "")
                    + f": {'met' if t['met'] else 'MISSED'}")
        if entry.get("status", "ok") != "ok":
            row += f"   {entry['status']}"
        lines.append(row)
    if res.get("peak_check"):
        p = res["peak_check"]
        lines.append(f"  cupyconv at {100 * p['fraction']:.1f}% of the {p['peak_key']} GEMM peak (compute-bound case), "
                     f"target >= {100 * p['target']:g}%: {'met' if p['met'] else 'MISSED'}")
    return "\n".join(lines)


def _fmt_duration(ms: float) -> str:
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.2f} ms" if ms < 1e3 else f"{ms / 1e3:.2f} s"


def _fmt_clock(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}:{seconds:02d}"


class Progress:
    """One line per finished case and pass, for long runs: how many of how many, each contender's median (the
    alternatives' with cupyconv's ratio to it), the time since the first case started, and about how long is left:
    the mean time per case-pass so far times the number left, cut to what the time limit (a deadline on
    time.perf_counter(), or None) still lets start.  stream None prints nothing (--quiet)."""

    def __init__(self, total: int, stream, deadline: float | None = None):
        self.total, self.stream, self.deadline = total, stream, deadline
        self.done = 0
        self.t0 = time.perf_counter()

    def skip(self, count: int) -> None:
        """Counts out case-passes that the time limit kept from starting."""
        self.total -= count

    def finished(self, res: dict, now: float | None = None) -> str:
        """Counts one case-pass as done; prints its line (unless quiet) and returns it."""
        now = time.perf_counter() if now is None else now
        self.done += 1
        elapsed = now - self.t0
        mean = elapsed / self.done
        left = mean * (self.total - self.done)
        if self.deadline is not None:   # no case starts after the deadline; the one under way still finishes
            left = min(left, max(self.deadline - now, 0.0) + mean)
        ratios = res["ratios"].get("cupyconv", {})
        figures = {True: [], False: []}   # cupyconv's contenders, the alternatives
        for name, entry in res["contenders"].items():
            if "median_ms" not in entry:   # "error" or "not implemented"
                figures[bool(entry.get("ours"))].append(f"{name} {entry['status'].split(':')[0]}")
                continue
            ratio = ratios.get(name)
            figures[bool(entry.get("ours"))].append(f"{name} {_fmt_duration(entry['median_ms'])}"
                                                    + (f" ({ratio['ratio_of_medians']:.2f}x)" if ratio else ""))
        text = (f"[{self.done}/{self.total}] ({res['case']}) {res['op']} {res['precision']} {res['pass']}: "
                + ", ".join(figures[True]) + " vs " + ", ".join(figures[False])
                + f" | {_fmt_clock(elapsed)} elapsed, about {_fmt_clock(left)} left")
        if self.stream is not None:
            print(text, file=self.stream, flush=True)
        return text


def summary_table(results: list) -> str:
    lines = ["", "targets (cupyconv time / alternative time, same run; the baseline, or the fastest alternative):",
             f"  {'case':<16} {'pass':<8} {'alternative':<44} {'ratio':>7} {'target':>7}  {'result':<7} others' CPU"]
    for res in results:
        t = res.get("target_check")
        if t:
            lines.append(f"  {res['case']:<16} {res['pass']:<8} {t['vs']:<44} {t['ratio']:>6.2f}x "
                         f"{t['target']:>6g}x  {'met' if t['met'] else 'MISSED':<7} {res['others_cpu_pct']}%"
                         + ("  (noisy)" if (res["others_cpu_pct"] or 0) >= QUIET_PCT else ""))
    checks = [res for res in results if res.get("peak_check")]
    if checks:
        lines += ["", "fraction of the measured GEMM peak (compute-bound tensor-core cases, cupyconv):"]
        for res in checks:
            p = res["peak_check"]
            lines.append(f"  {res['case']:<16} {res['pass']:<8} {100 * p['fraction']:>5.1f}% of "
                         f"{p['peak_tflops']:.0f} TFLOP/s ({p['peak_key']})  target >= {100 * p['target']:g}%: "
                         f"{'met' if p['met'] else 'MISSED'}")
    return "\n".join(lines)


def list_cases() -> str:
    lines = []
    for c in cases_mod.ALL_CASES:
        targets = ""
        if c.target is not None:
            targets = f"  target <= {c.target:.3g}x"
            if c.target_bwd is not None:
                targets += f" fwd, <= {c.target_bwd:.3g}x fwd+bwd"
            if c.target_vs == "best":
                targets += " vs the fastest alternative"
        tags = f"  [{', '.join(c.tags)}]" if c.tags else ""
        lines.append(f"{c.label:<16} {c.name}{targets}{tags}")
    return "\n".join(lines)


def self_check() -> list[str]:
    """What --smoke checks beyond running the cases (CI has no GPU): the case table, the FLOP and byte arithmetic
    against hand-computed values, the bfloat16 inputs, the TF32 switching, the target and peak checks."""
    problems = list(cases_mod.check_table())
    by_label = {c.label: c for c in cases_mod.ALL_CASES}

    def expect(what, got, want):
        if got != want:
            problems.append(f"{what}: {got!r}, expected {want!r}")

    # The seed patch shape and ResNet-50's first 3x3 layer in float16 (RESULTS.md quotes these figures).
    seed, r50 = by_label["p-seed-gpu16"], by_label["r50-64-gpu16"]
    seed_flops = 2 * 20480 * 64 * 4 * 4 * 32 * 3 * 3
    expect("p-seed FLOPs", cases_mod.flops(seed), seed_flops)
    expect("p-seed fwd+bwd FLOPs", cases_mod.flops(seed, True), 3 * seed_flops)
    x, w, b, y = 20480 * 32 * 16, 64 * 32 * 9, 64, 20480 * 64 * 16
    expect("p-seed bytes", cases_mod.floor_bytes(seed), 2 * (x + w + b + y))
    expect("p-seed fwd+bwd bytes", cases_mod.floor_bytes(seed, True), 2 * 2 * (x + w + b + y))
    expect("r50-64 FLOPs", cases_mod.flops(r50), 2 * 32 * 64 * 56 * 56 * 64 * 9)
    expect("r50-64 bytes", cases_mod.floor_bytes(r50), 2 * (2 * 32 * 64 * 56 * 56 + 64 * 64 * 9 + 64))
    expect("rx-512 FLOPs (groups 32)", cases_mod.flops(by_label["rx-512-gpubf16"]), 2 * 32 * 512 * 14 * 14 * 16 * 9)
    expect("bfloat16 itemsize", cases_mod.floor_bytes(by_label["r50-64-gpubf16"]), cases_mod.floor_bytes(r50))
    expect("tf32 itemsize", cases_mod.floor_bytes(by_label["r50-64-gputf32"]), 2 * cases_mod.floor_bytes(r50))
    expect("peak key of a TF32 case", cases_mod.peak_key(by_label["r50-64-gputf32"]), "tf32")
    # Issue 13's N-d and transposed cases (RESULTS.md quotes these figures), fp16.
    c1d, c3d, ct2d = by_label["c1d-audio-gpu16"], by_label["c3d-video-gpu16"], by_label["ct2d-k4s2-gpu16"]
    expect("c1d-audio FLOPs", cases_mod.flops(c1d), 2 * 8 * 16384 * 256 * 256 * 3)
    expect("c1d-audio bytes", cases_mod.floor_bytes(c1d), 2 * (2 * 8 * 256 * 16384 + 256 * 256 * 3 + 256))
    expect("c3d-video FLOPs", cases_mod.flops(c3d), 2 * 2 * 16 * 56 * 56 * 64 * 64 * 27)
    expect("c3d-video bytes", cases_mod.floor_bytes(c3d), 2 * (2 * 2 * 64 * 16 * 56 * 56 + 64 * 64 * 27 + 64))
    expect("ct2d-k4s2 output", cases_mod.shapes(ct2d)["y"], (8, 128, 56, 56))
    expect("ct2d-k4s2 weight (in, out, k, k)", cases_mod.shapes(ct2d)["w"], (256, 128, 4, 4))
    expect("ct2d-k4s2 FLOPs (input pixels x taps)", cases_mod.flops(ct2d), 2 * 8 * 28 * 28 * 256 * 128 * 16)
    expect("ct2d-k4s2 fwd+bwd bytes", cases_mod.floor_bytes(ct2d, True),
           2 * 2 * (8 * 256 * 28 * 28 + 256 * 128 * 16 + 128 + 8 * 128 * 56 * 56))
    expect("ct2d-k2s2 output", cases_mod.shapes(by_label["ct2d-k2s2-gpu32"])["y"], (8, 128, 56, 56))
    expect("issue13 selects", [c.label for c in cases_mod.select(["issue13"], ("gpu",))],
           [c.label for c in cases_mod.ND_CASES])
    # The roofline at round numbers: 1 PFLOP/s and 2 TB/s; p-seed is memory-bound there, r50-64 compute-bound.
    r = cases_mod.roofline(seed, False, 1e-4, 1e15, 2e12)
    expect("p-seed floor ms", round(r["floor_ms"], 9), round(2 * (x + w + b + y) / 2e12 * 1e3, 9))
    expect("p-seed floor bound", r["floor_bound"], "memory")
    expect("p-seed TFLOP/s at 100 us", round(r["tflops"], 6), round(seed_flops / 1e-4 / 1e12, 6))
    expect("p-seed fraction of peak", round(r["peak_fraction"], 9), round(seed_flops / 1e-4 / 1e15, 9))
    expect("r50-64 floor bound", cases_mod.roofline(r50, False, None, 1e15, 4e12)["floor_bound"], "compute")
    # Targets: patch fp16/bf16 forward 0.8x and fwd+bwd 1.0x of the fastest alternative; conv2d 1.3x cuDNN.
    for label, forward in (("p-seed-gpu16", 1 / 1.3), ("p-seed-gpubf16", 0.8), ("p-8x8-gpu16", 1 / 1.3),
                           ("p-8x8-gpubf16", 0.8)):  # float16 keeps issue 5's stricter forward target
        c = by_label[label]
        expect(f"{label} targets", (c.target_for(False), c.target_for(True), c.target_vs), (forward, 1.0, "best"))
    for label in ("r50-64-gpu16", "r50-64-gpubf16", "r50-512-gpubf16"):
        expect(f"{label} target", by_label[label].target_for(True), 1.3)
    fake = {"contenders": {"cupyconv": {"ours": True, "status": "ok", "median_ms": 2.0,
                                        "roofline": {"peak_fraction": 0.4}},
                           "a": {"status": "ok", "median_ms": 3.0}, "b": {"status": "ok", "median_ms": 2.5},
                           "c": {"status": "error: x", "median_ms": 1.0}},
            "roofline": {"floor_bound": "compute", "peak_key": "float16", "peak_tflops": 700.0}}
    expect("fastest alternative", fastest_alternative(fake), "b")
    expect("peak check", peak_check(r50, fake, 0.5)["met"], False)
    expect("peak check (memory-bound)", peak_check(r50, {**fake, "roofline": {"floor_bound": "memory"}}, 0.5), None)
    # bfloat16 inputs reach torch bit for bit.
    inputs = cases_mod.make_inputs(cases_mod.smoke(by_label["p-seed-gpubf16"]))
    expect("bfloat16 input dtype", inputs["x"].dtype.name, "bfloat16")
    torch = _torch()
    if torch is not None:
        t = cases_mod._to_torch(inputs["x"], "cpu")
        same_bits = bool((t.view(torch.int16).numpy() == inputs["x"].view(numpy.int16)).all())
        expect("bfloat16 to torch", (t.dtype, same_bits), (torch.bfloat16, True))
    # TF32 on for exactly a tf32 block, off again after (also when the block raises).
    before = precision_state()
    with precision(True) as state:
        expect("TF32 inside a tf32 case", set(state.values()), {True})
    expect("TF32 after a tf32 case", precision_state(), before)
    try:
        with precision(True):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    expect("TF32 after a tf32 case that raised", precision_state(), before)
    with precision(False) as state:
        expect("TF32 inside a strict case", set(state.values()), {False})
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "gpu", "all"), default="cpu")
    parser.add_argument("--cases", default="", help="comma-separated case labels or tags (i,ii,i-gpu16,issue11,...), "
                                                    "run in that order")
    parser.add_argument("--pass", dest="passes", choices=("fwd", "fwd+bwd", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, two samples: checks the harness runs")
    parser.add_argument("--json", type=Path, help="write the results here, and at the end their plot beside them "
                                                  "(bench.json -> bench.png; needs matplotlib, the `plot` extra)")
    parser.add_argument("--no-plot", action="store_true", help="write the JSON only")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each case and pass, wait up to SECONDS for other processes to use less than "
                             f"{QUIET_PCT:g}%% of the CPUs (a shared machine); the wait is recorded")
    parser.add_argument("--time-limit", type=float, default=0.0, metavar="SECONDS",
                        help="start no new case after SECONDS (a lease's time limit); the JSON lists the rest "
                             "under 'not_run'")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines on stderr (by default one per case and pass as it finishes, with "
                             "the time elapsed and an estimate of the time left)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads for both libraries (sets OMP_NUM_THREADS and OPENBLAS_NUM_THREADS and "
                             "restarts; default: each library's own default)")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    if args.threads and os.environ.get("CUPYCONV_BENCH_THREADS") != str(args.threads):
        # Thread pools are sized when the libraries load: set the environment and start again.
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "CUPYCONV_BENCH_THREADS"):
            os.environ[var] = str(args.threads)
        os.execv(sys.executable, [sys.executable, "-m", "benchmarks.run", *sys.argv[1:]])

    devices = ("cpu", "gpu") if args.device == "all" else (args.device,)
    wanted = list(dict.fromkeys(c.strip() for c in args.cases.split(",") if c.strip()))
    selected = cases_mod.select(wanted, devices)
    if args.list:
        print(list_cases())
        return 0
    if args.smoke:
        selected = [cases_mod.smoke(c) for c in selected]
        if "gpu" not in devices:  # a few GPU cases' dtypes and switches, run on the CPU (see SMOKE_ON_CPU)
            selected += [cases_mod.smoke_on_cpu(c) for c in cases_mod.select(wanted, ("gpu",))
                         if c.label in cases_mod.SMOKE_ON_CPU]
    if not selected:
        parser.error(f"no case matches --device {args.device} --cases {args.cases!r}; see --list")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.smoke:
        problems = self_check()
        print("self-check: " + ("ok" if not problems else "FAILED"))
        for problem in problems:
            print("FAILED: self-check:", problem, file=sys.stderr)
        if problems:
            return 1
    if "gpu" in devices:
        setup_gpu()

    meta = environment("gpu" if "gpu" in devices else "cpu")
    print(f"cupyconv {meta['cupyconv']} ({meta['git_commit']}) | numpy {meta['numpy']} ({meta['numpy_blas']}) | "
          f"torch {meta['torch']} | cupy {meta['cupy']} | python {meta['python']}")
    print(f"{meta['cpu_model']}, {meta['cpus_usable']} usable CPUs, load average {meta['load_average_start']}"
          + (f" | GPU {meta['gpu']['name']}" if "gpu" in meta else "") + f" | {meta['date']} | mode {mode}")

    # The roofline's references, once per process: on the GPU always, on the CPU only under --smoke.
    peak_device = "gpu" if "gpu" in devices else "cpu"
    keys = {cases_mod.peak_key(c) for c in selected if c.device == peak_device and c.op != "unfold"}
    meta["peaks"] = measure_peaks(keys, peak_device, mode, lambda text: print(text, flush=True))
    peak_target = cases_mod.PEAK_TARGET if mode != "smoke" else None

    passes = {"fwd": (False,), "fwd+bwd": (True,), "both": (False, True)}[args.passes]
    results, not_run = [], []
    run_load = _LoadMeter()
    settings = {d: SETTINGS[d][mode] for d in devices}
    progress = Progress(len(selected) * len(passes), None if args.quiet else sys.stderr,
                        t_start + args.time_limit if args.time_limit else None)

    def write_json(complete: bool) -> None:
        # Rewritten after every case and pass, so a run cut short (a time limit) keeps what it measured.
        payload = {"meta": meta, "mode": mode, "settings": settings, "complete": complete, "results": results}
        if args.time_limit:
            payload.update(time_limit_s=args.time_limit, not_run=not_run)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        partial = args.json.with_name(args.json.name + ".partial")
        partial.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        partial.replace(args.json)

    for case in selected:
        if args.time_limit and time.perf_counter() - t_start > args.time_limit:
            not_run.extend(f"{case.label} {'fwd+bwd' if backward else 'fwd'}" for backward in passes)
            progress.skip(len(passes))
            continue
        print(f"\n({case.label}) {case.name}" + (f"  [{case.note}]" if case.note else ""))
        for backward in passes:
            waited = wait_for_quiet(args.wait_quiet) if args.wait_quiet else 0.0
            res = measure(case, backward, mode, lambda text: print(text, flush=True),
                          meta["peaks"] if case.device == peak_device else None, peak_target)
            res["waited_for_quiet_s"] = round(waited, 1)
            results.append(res)
            progress.finished(res)
            if args.json:
                write_json(False)
    meta["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    meta["others_cpu_pct"] = run_load.others_pct()
    print(summary_table(results))
    if not_run:
        print(f"time limit of {args.time_limit:g} s reached: {len(not_run)} case-passes not run "
              f"({', '.join(not_run[:6])}{', ...' if len(not_run) > 6 else ''})")
    print(f"other processes used {meta['others_cpu_pct']}% of the CPUs during the run (0: quiet machine)")

    if args.json:
        write_json(True)
        print(f"wrote {args.json}")
        if not args.no_plot:
            try:
                print(f"wrote {plot.draw(report.load(args.json), plot.png_path(args.json))}")
            except plot.MatplotlibMissing as e:   # the figures are in the JSON; the plot can be drawn later
                print(f"{e}; then: python -m benchmarks.report --plot {args.json}", file=sys.stderr)

    failures = [(r["case"], r["pass"], name, e["status"]) for r in results for name, e in r["contenders"].items()
                if e["status"].startswith("error")]
    for failure in failures:
        print("FAILED:", *failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
