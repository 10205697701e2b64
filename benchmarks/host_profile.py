"""Where a GPU call's time goes: the host's Python glue or the GPU's kernels (needs a CUDA GPU, CuPy and torch).

    python -m benchmarks.host_profile --out DIR [--cases r50-64-gpu16,iii-gpu32] [--calls 30] [--autotune off]
    python -m benchmarks.host_profile --json FILE --no-cprofile --dry-run   # anywhere: checks the code on the CPU

The first GPU run (2026-11-26, H200) measured every cupyconv case-pass at 0.2-3 ms whatever its size, 5-50x the
kernels' predicted time, the signature of a host-bound call.  For each case and pass this prints, side by side:

  host_us    wall clock per call of `calls` calls enqueued back to back with no synchronisation (the glue's
             Python, CuPy's launch and allocation calls; the GPU runs behind unless the queue fills)
  gpu_us     wall clock per call of the same calls followed by one synchronisation
  kernel_us  the sum of the GPU durations of the kernels one call launched (torch.profiler's CUPTI trace, which
             records CuPy's launches too), and their names and count
  benchmark_timer  benchmarks.run's own GPU timer on the same call (CUDA events around 20 queued calls), alone
             and with the baseline contender's turns between its samples, as the benchmark interleaves them
  and a cProfile of the host calls (top functions by own and by cumulative time), all in DIR/cprofile.txt

The per-kernel times are what `benchmarks.calibrate` compares with the model's predictions; `benchmarks.gpu_check`
runs this (autotuning off: the model's plan) for its calibration table, and again with autotuning on for a few
cases (`gpu_check.PROFILE_AUTOTUNE_CASES`).  With --autotune on each case-pass also records "autotune_picks": what
'auto' ran in each pass, the heuristic's pick beside it and the candidates' timed GPU times
(`benchmarks.launches.autotune_picks`).  --dry-run needs no GPU: the host times
are the NumPy path's on each case's smoke shapes, and the kernels are those the case launches at its real shapes
(`benchmarks.launches.record`: names and counts, 0 us: nothing ran on a GPU).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

from benchmarks import cases as cases_mod

DEFAULT_CASES = ("r50-64-gpu16", "p-seed-gpu16", "iii-gpu32", "dw-480-14-gpu16", "iv-gpu16", "r50-64-gpu32")


def kernel_times(fn, calls: int) -> tuple[float, dict]:
    """Microseconds of GPU kernel time per call, and {kernel name: (launches per call, us per call)}."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels: dict = {}
    for ev in prof.events():
        if str(getattr(ev, "device_type", "")).endswith("CUDA") or getattr(ev, "device_type", None) == 1:
            us = ev.time_range.elapsed_us()   # a device event's own range is the kernel's duration
            count, total = kernels.get(ev.name, (0, 0.0))
            kernels[ev.name] = (count + 1, total + us)
    per_call = {name[:90]: (count / calls, total / calls) for name, (count, total) in kernels.items()}
    return sum(t for _, t in per_call.values()), per_call


def host_times(fn, calls: int, sync) -> tuple[float, float]:
    """(us per call enqueued with no synchronisation, us per call including one synchronisation at the end)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def benchmark_timer_us(case, timed_case, inputs, backward: bool, fn, dry_run: bool) -> dict:
    """The benchmark's own timer on the same call, alone and interleaved with the baseline contender's turns.

    The first H100 run measured r50-64 fp16 fwd at 186.6 us a call in benchmarks.run and 133.0 us wall here (the
    same commit; autotuning was ruled out on the CPU): this splits that gap between the timer (CUDA events around
    calls enqueued back to back, as many as its quick mode queues) and the interleaving with another library's
    turns (caches, allocators), measured in the same process on the same fn.  Dry run: the CPU timer, so that the code runs anywhere."""
    from benchmarks.run import SETTINGS
    from benchmarks.timing import CudaTimer, time_cpu
    queued = SETTINGS["gpu"]["quick"]["max_burst"]   # the calls a turn of the benchmark's quick mode queues at most
    timer = time_cpu if dry_run else CudaTimer("cupy")
    baseline = cases_mod.baseline_for(case)
    other = baseline.build(timed_case, inputs, backward)
    other_timer = time_cpu if dry_run else CudaTimer(baseline.library)
    other()
    alone = [timer(fn, queued)["s"] for _ in range(TIMER_SAMPLES)]
    interleaved = []
    for _ in range(TIMER_SAMPLES):
        other_timer(other, queued)
        interleaved.append(timer(fn, queued)["s"])
    return {"queued_calls": queued, "baseline": baseline.name,
            "alone_us": statistics.median(alone) * 1e6, "interleaved_us": statistics.median(interleaved) * 1e6}


#: The samples of each of `benchmark_timer_us`'s figures.
TIMER_SAMPLES = 5


def recorded_kernels(case, backward: bool) -> tuple[float, dict]:
    """--dry-run's stand-in for `kernel_times`: the kernels the case launches at its real shapes (recorded, not
    run), named as a CUPTI trace names them, with their counts and 0 us."""
    from benchmarks import launches
    kernels: dict = {}
    for step in launches.record(case, backward).steps:
        if isinstance(step, launches.ArrayWork):
            name = f"cupy_{step.kind}"
        elif isinstance(step, launches.Gemm):
            name = "cuBLAS gemm (dry run)"
        else:
            name = f"void {step.name}(...)"
        count, total = kernels.get(name, (0, 0.0))
        kernels[name] = (count + 1, total)
    return 0.0, kernels


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for host_profile.json and cprofile.txt")
    parser.add_argument("--json", type=Path, help="write the JSON here instead of OUT/host_profile.json")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--autotune", choices=("on", "off"), default="on")
    parser.add_argument("--no-cprofile", dest="cprofile", action="store_false", help="no cProfile pass")
    parser.add_argument("--torch", action="store_true",
                        help="profile cupyconv.torch's ops on torch tensors (autograd, what a torch user runs) "
                             "instead of the plain functions on CuPy arrays: the H200 measured that path 3.5-10x "
                             "slower per call, and this says where")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: host times of the NumPy path on smoke shapes, kernels recorded, not run")
    args = parser.parse_args(argv)
    if args.out is None and (args.json is None or args.cprofile):
        parser.error("give --out (or --json with --no-cprofile)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    import cupyconv
    from benchmarks import launches
    from benchmarks import run as run_mod
    if args.dry_run:
        sync = lambda: None   # noqa: E731  (the NumPy path is synchronous)
    else:
        import cupy
        run_mod.setup_gpu()
        sync = cupy.cuda.Device().synchronize
    # autotuning as asked, for this run only: a caller in the same process (the tests) keeps its setting
    with cupyconv.settings.autotune(args.autotune == "on"):
        rows, report = [], {}
        for case in cases_mod.select(args.cases.split(","), ("gpu",)):
            timed_case = cases_mod.smoke_on_cpu(case) if args.dry_run else case
            inputs = cases_mod.make_inputs(timed_case)
            for backward in (False, True):
                name = f"{case.label}-{'fwdbwd' if backward else 'fwd'}{'-torch' if args.torch else ''}"
                try:
                    with run_mod.precision(case.tf32):
                        build = cases_mod.build_cupyconv_torch if args.torch else cases_mod.build_cupyconv
                        fn = build(timed_case, inputs, backward)
                        for _ in range(5):
                            fn()
                        sync()
                        host_us, wall_us = min(host_times(fn, args.calls, sync) for _ in range(3))
                        picks = launches.autotune_picks(fn) if args.autotune == "on" else None
                        kernel_us, kernels = recorded_kernels(case, backward) if args.dry_run else kernel_times(fn, 5)
                        timers = benchmark_timer_us(case, timed_case, inputs, backward, fn, args.dry_run)
                        if args.cprofile:
                            profiler = cProfile.Profile()
                            profiler.enable()
                            for _ in range(args.calls):
                                fn()
                            profiler.disable()
                            sync()
                    if args.cprofile:
                        stream = io.StringIO()
                        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(40)
                        stream.write("\n\n")
                        pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(60)
                        with open(args.out / "cprofile.txt", "a") as f:
                            f.write(f"==================== {name}\n{stream.getvalue()}")
                    report[name] = {"host_us": host_us, "wall_us": wall_us, "kernel_us": kernel_us,
                                    "kernels": kernels, "benchmark_timer": timers,
                                    **({"dry_run": True} if args.dry_run else {}),
                                    **({} if picks is None else {"autotune_picks": picks})}
                    rows.append(f"| {name} | {host_us:.1f} | {wall_us:.1f} | {kernel_us:.1f} | "
                                f"{sum(c for c, _ in kernels.values()):.0f} | {timers['alone_us']:.1f} | "
                                f"{timers['interleaved_us']:.1f} |")
                except Exception as e:   # one case failing must not lose the others
                    report[name] = {"error": f"{type(e).__name__}: {e}"}
                    rows.append(f"| {name} | error: {type(e).__name__}: {str(e)[:80]} | | | | | |")
                print(rows[-1], flush=True)
                # after every case-pass, so that a run stopped at its time limit keeps what it measured
                target = args.json or args.out / "host_profile.json"
                partial = target.with_name(target.name + ".partial")
                partial.write_text(json.dumps(report, indent=1))
                partial.replace(target)   # whole or not at all, should the time limit stop the run here
    print("\n| case-pass | host us/call (no sync) | wall us/call (sync at end) | kernel us/call | kernels/call | "
          "benchmark timer us/call | the same, interleaved with the baseline |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
