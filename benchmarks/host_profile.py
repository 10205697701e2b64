"""Where a GPU call's time goes: the host's Python glue or the GPU's kernels (needs a CUDA GPU, CuPy and torch).

    python -m benchmarks.host_profile --out DIR [--cases r50-64-gpu16,iii-gpu32] [--calls 30]

The first GPU run (2026-11-26, H200) measured every cupyconv case-pass at 0.2-3 ms whatever its size, 5-50x the
kernels' predicted time, the signature of a host-bound call.  For each case and pass this prints, side by side:

  host_us    wall clock per call of `calls` calls enqueued back to back with no synchronisation (the glue's
             Python, CuPy's launch and allocation calls; the GPU runs behind unless the queue fills)
  gpu_us     wall clock per call of the same calls followed by one synchronisation (what the benchmarks measure)
  kernel_us  the sum of the GPU durations of the kernels one call launched (torch.profiler's CUPTI trace, which
             records CuPy's launches too), and their names and count
  and a cProfile of the host calls (top functions by own and by cumulative time), all in DIR/cprofile.txt
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--autotune", choices=("on", "off"), default="on")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import cupy
    import cupyconv
    from benchmarks import run as run_mod
    run_mod.setup_gpu()
    cupyconv.set_autotune(args.autotune == "on")
    sync = cupy.cuda.Device().synchronize
    rows, report = [], {}
    for case in cases_mod.select(args.cases.split(","), ("gpu",)):
        inputs = cases_mod.make_inputs(case)
        for backward in (False, True):
            name = f"{case.label}-{'fwdbwd' if backward else 'fwd'}"
            try:
                with run_mod.precision(case.tf32):
                    fn = cases_mod.build_cupyconv(case, inputs, backward)
                    for _ in range(5):
                        fn()
                    sync()
                    host_us, wall_us = min(host_times(fn, args.calls, sync) for _ in range(3))
                    kernel_us, kernels = kernel_times(fn, 5)
                    profiler = cProfile.Profile()
                    profiler.enable()
                    for _ in range(args.calls):
                        fn()
                    profiler.disable()
                    sync()
                stream = io.StringIO()
                pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(40)
                stream.write("\n\n")
                pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(60)
                with open(args.out / "cprofile.txt", "a") as f:
                    f.write(f"==================== {name}\n{stream.getvalue()}")
                report[name] = {"host_us": host_us, "wall_us": wall_us, "kernel_us": kernel_us,
                                "kernels": kernels}
                rows.append(f"| {name} | {host_us:.1f} | {wall_us:.1f} | {kernel_us:.1f} | "
                            f"{sum(c for c, _ in kernels.values()):.0f} |")
            except Exception as e:   # one case failing must not lose the others
                report[name] = {"error": f"{type(e).__name__}: {e}"}
                rows.append(f"| {name} | error: {type(e).__name__}: {str(e)[:80]} | | | |")
            print(rows[-1], flush=True)
    (args.out / "host_profile.json").write_text(json.dumps(report, indent=1))
    print("\n| case-pass | host us/call (no sync) | wall us/call (sync at end) | kernel us/call | kernels/call |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
