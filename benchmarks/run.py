"""Benchmark cupyconv against the alternatives a user would pick, in the same run.

    python -m benchmarks.run --device cpu --json bench.json          # the CPU cases (i)-(iv)
    python -m benchmarks.run --device gpu --json bench-gpu.json      # CuPy arrays and torch CUDA tensors
    python -m benchmarks.run --cases ii,iv --quick                   # a subset, fewer samples
    python -m benchmarks.run --smoke                                 # tiny shapes: checks the harness runs

For every case and pass (forward; forward + backward) each contender first runs once and its outputs are
checked against the baseline's; then the contenders are timed in interleaved rounds (one call each per round,
the order rotated every round), so load from elsewhere on the machine falls on all of them alike.  A case's
figures are the median over rounds; ratios are cupyconv's median / the alternative's median (below 1: cupyconv
is faster), with the median of the per-round ratios beside it as a check on noise.
"""
from __future__ import annotations

import argparse
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
from .timing import CudaTimer, Samples, time_cpu

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


TOLERANCE = {"float32": 1e-3, "float64": 1e-9, "float16": 2e-2, "bfloat16": 5e-2}


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
                     "CUPY_TF32": os.environ.get("CUPY_TF32", "0")},
        }
        if hasattr(cupyconv, "get_allow_tf32"):
            meta["gpu"]["tf32"]["cupyconv"] = cupyconv.get_allow_tf32()
        meta["gpu"]["cupyconv_autotune"] = hasattr(cupyconv, "set_autotune")
        if meta["cupy"]:
            import cupy
            meta["gpu"]["cupy_cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
            meta["gpu"]["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
    return meta


def setup_gpu() -> None:
    """torch as a user tuning for speed would set it, with strict fp32 (no TF32) on both libraries."""
    import torch
    if not torch.cuda.is_available():
        sys.exit("benchmarks: --device gpu needs torch with CUDA and a visible GPU")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("CUPY_TF32", "0")
    import cupyconv
    # cupyconv's counterpart of cudnn.benchmark, and strict fp32 on its side too.
    if hasattr(cupyconv, "set_autotune"):
        cupyconv.set_autotune(True)
    if hasattr(cupyconv, "set_allow_tf32"):
        cupyconv.set_allow_tf32(False)


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


def measure(case: cases_mod.Case, backward: bool, mode: str, log) -> dict:
    cfg = SETTINGS[case.device][mode]
    inputs = cases_mod.make_inputs(case)
    contenders = cases_mod.contenders_for(case)
    baseline = cases_mod.baseline_for(case)
    result = {"case": case.label, "name": case.name, "op": case.op, "dims": case.dims, "device": case.device,
              "dtype": case.dtype, "pass": "fwd+bwd" if backward else "fwd", "target": case.target,
              "baseline": baseline.name, "contenders": {}, "ratios": {}}

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
        if c is baseline:
            reference = outputs
        elif reference is not None:
            err = _max_rel_err(outputs, reference)
            entry["max_rel_err_vs_baseline"] = err
            if not err <= TOLERANCE[case.dtype]:
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
            burst = [timers[name](fn) for _ in range(bursts[name])]
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
    if case.target is not None and "cupyconv" in result["ratios"] and baseline.name in result["ratios"]["cupyconv"]:
        ratio = result["ratios"]["cupyconv"][baseline.name]["ratio_of_medians"]
        result["target_check"] = {"vs": baseline.name, "ratio": ratio, "target": case.target,
                                  "met": ratio <= case.target}
    log(format_result(result))
    return result


# ---------------------------------------------------------------------------------------------------------
# Output


def format_result(res: dict) -> str:
    ours = list(res["ratios"])
    lines = [f"  {res['pass']}: {res.get('rounds', 0)} rounds, calls per turn {res.get('calls_per_turn')}, "
             f"other processes used {res.get('others_cpu_pct')}% of the CPUs meanwhile"]
    head = f"  {'pass':<8} {'contender':<44} {'median ms':>10} {'IQR %':>6} {'n':>4}"
    head += "".join(f" {(o if o == 'cupyconv' else 'cc.torch') + ' / it':>16}" for o in ours)
    lines.append(head)
    for name, entry in res["contenders"].items():
        if entry.get("status", "ok") != "ok" and "median_ms" not in entry:
            lines.append(f"  {res['pass']:<8} {name:<44} {entry['status'][:90]}")
            continue
        row = f"  {res['pass']:<8} {name:<44} {entry['median_ms']:>10.3f} {entry['iqr_pct']:>6.1f} {entry['n']:>4}"
        for o in ours:
            ratio = res["ratios"][o].get(name)
            row += f" {ratio['ratio_of_medians']:>15.2f}x" if ratio else f" {'':>16}"
        if name == res.get("target_check", {}).get("vs"):
            t = res["target_check"]
            row += f"   target <= {t['target']:g}x: {'met' if t['met'] else 'MISSED'}"
        if entry.get("status", "ok") != "ok":
            row += f"   {entry['status']}"
        lines.append(row)
    return "\n".join(lines)


def summary_table(results: list) -> str:
    lines = ["", "targets (cupyconv time / baseline time, same run):",
             f"  {'case':<6} {'pass':<8} {'baseline':<44} {'ratio':>7} {'target':>7}  {'result':<7} others' CPU"]
    for res in results:
        t = res.get("target_check")
        if t:
            lines.append(f"  {res['case']:<6} {res['pass']:<8} {t['vs']:<44} {t['ratio']:>6.2f}x "
                         f"{t['target']:>6g}x  {'met' if t['met'] else 'MISSED':<7} {res['others_cpu_pct']}%"
                         + ("  (noisy)" if (res["others_cpu_pct"] or 0) >= QUIET_PCT else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "gpu", "all"), default="cpu")
    parser.add_argument("--cases", default="", help="comma-separated case labels (i,ii,iii,iv,i-gpu16,...)")
    parser.add_argument("--pass", dest="passes", choices=("fwd", "fwd+bwd", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, two samples: checks the harness runs")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each case and pass, wait up to SECONDS for other processes to use less than "
                             f"{QUIET_PCT:g}%% of the CPUs (a shared machine); the wait is recorded")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads for both libraries (sets OMP_NUM_THREADS and OPENBLAS_NUM_THREADS and "
                             "restarts; default: each library's own default)")
    args = parser.parse_args(argv)
    if args.threads and os.environ.get("CUPYCONV_BENCH_THREADS") != str(args.threads):
        # Thread pools are sized when the libraries load: set the environment and start again.
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "CUPYCONV_BENCH_THREADS"):
            os.environ[var] = str(args.threads)
        os.execv(sys.executable, [sys.executable, "-m", "benchmarks.run", *sys.argv[1:]])

    devices = ("cpu", "gpu") if args.device == "all" else (args.device,)
    wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
    selected = [c for c in cases_mod.CASES if c.device in devices and (not wanted or c.label in wanted)]
    if args.list:
        for c in cases_mod.CASES:
            print(f"{c.label:<10} {c.name}" + (f"  target <= {c.target:g}x" if c.target else ""))
        return 0
    if not selected:
        parser.error(f"no case matches --device {args.device} --cases {args.cases!r}; see --list")
    if args.smoke:
        selected = [cases_mod.smoke(c) for c in selected]
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if "gpu" in devices:
        setup_gpu()

    meta = environment("gpu" if "gpu" in devices else "cpu")
    print(f"cupyconv {meta['cupyconv']} ({meta['git_commit']}) | numpy {meta['numpy']} ({meta['numpy_blas']}) | "
          f"torch {meta['torch']} | cupy {meta['cupy']} | python {meta['python']}")
    print(f"{meta['cpu_model']}, {meta['cpus_usable']} usable CPUs, load average {meta['load_average_start']}"
          + (f" | GPU {meta['gpu']['name']}" if "gpu" in meta else "") + f" | {meta['date']} | mode {mode}")

    passes = {"fwd": (False,), "fwd+bwd": (True,), "both": (False, True)}[args.passes]
    results = []
    run_load = _LoadMeter()
    for case in selected:
        print(f"\n({case.label}) {case.name}" + (f"  [{case.note}]" if case.note else ""))
        for backward in passes:
            waited = wait_for_quiet(args.wait_quiet) if args.wait_quiet else 0.0
            res = measure(case, backward, mode, lambda text: print(text, flush=True))
            res["waited_for_quiet_s"] = round(waited, 1)
            results.append(res)
    meta["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    meta["others_cpu_pct"] = run_load.others_pct()
    print(summary_table(results))
    print(f"other processes used {meta['others_cpu_pct']}% of the CPUs during the run (0: quiet machine)")

    if args.json:
        settings = {d: SETTINGS[d][mode] for d in devices}
        payload = {"meta": meta, "mode": mode, "settings": settings, "results": results}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")

    failures = [(r["case"], r["pass"], name, e["status"]) for r in results for name, e in r["contenders"].items()
                if e["status"].startswith("error")]
    for failure in failures:
        print("FAILED:", *failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
