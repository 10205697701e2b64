"""Compile every kernel instantiation for the current GPU ahead of time: ``python -m cupyconv.precompile``.

A first call of each op otherwise waits for NVRTC (a cold compile of all instantiations takes minutes on one
core).  This compiles each one exactly as the kernel loader does (`_device._cuda_function_on`: the same source,
options and name expression, so the same key in CuPy's disk cache, ``~/.cupy/kernel_cache`` or
``CUPY_CACHE_DIR``), on several threads (NVRTC runs without the GIL), and loads them into this process.  Run it
once per machine and CUDA/CuPy version when deploying, or at the start of a GPU job; later processes read the
binaries from the disk cache.

    python -m cupyconv.precompile              # every instantiation, one thread per CPU core
    python -m cupyconv.precompile --jobs 4     # four threads
    python -m cupyconv.precompile --dry-run    # list what it would compile (no GPU or CuPy needed)

Exit status 0 when everything compiled, 1 when something failed (each failure is printed), 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from typing import Callable, TextIO

from . import _device


def current_device() -> tuple[int, str]:
    """(id, description) of CuPy's current device, e.g. (0, "NVIDIA H100 80GB HBM3, sm_90")."""
    import cupy
    device = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return device.id, f"{name}, sm_{device.compute_capability}"


def compile_one(device_id: int, filename: str, name: str) -> None:
    """Compile and load one instantiation for device_id, as the first launch would."""
    import cupy
    with cupy.cuda.Device(device_id):
        _device._cuda_function_on(device_id, filename, name)


def precompile(jobs: int, stream: TextIO, compile_fn: Callable[[int, str, str], None] | None = None) -> int:
    """Compile all of `_device.all_instantiations()` for the current device on `jobs` threads, with a progress line
    and a summary on `stream`; returns how many failed."""
    compile_fn = compile_fn or compile_one
    kernels = _device.all_instantiations()
    device_id, description = current_device()
    _device.check_cupy_toolkit()   # one clear error instead of one per kernel
    print(f"compiling {len(kernels)} kernel instantiations for device {device_id} ({description}) on {jobs} "
          f"thread(s)", file=stream)
    failures: list[tuple[str, str, str]] = []
    begin = time.perf_counter()
    interactive = stream.isatty()
    step = max(1, len(kernels) // 10)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(compile_fn, device_id, filename, name): (filename, name)
                   for filename, name in kernels}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            filename, name = futures[future]
            error = future.exception()
            if error is not None:
                failures.append((filename, name, f"{type(error).__name__}: {error}"))
            if interactive or done % step == 0 or done == len(kernels):
                line = f"[{done:4d}/{len(kernels)}] {time.perf_counter() - begin:6.1f} s  {filename} {name}"
                print(("\r" + line[:150].ljust(150)) if interactive else line, end="" if interactive else "\n",
                      file=stream, flush=True)
    if interactive:
        print(file=stream)
    seconds = time.perf_counter() - begin
    print(f"compiled {len(kernels) - len(failures)} of {len(kernels)} kernel instantiations of "
          f"{len({f for f, _ in kernels})} files in {seconds:.1f} s; {len(failures)} failed", file=stream)
    for filename, name, message in failures:
        print(f"FAILED {filename} {name}: {message}", file=stream)
    return len(failures)


def dry_run(stream: TextIO) -> None:
    """List every instantiation, grouped by file, and the count: what `precompile` would compile."""
    kernels = _device.all_instantiations()
    for filename, name in kernels:
        print(f"{filename} {name}", file=stream)
    files = sorted({f for f, _ in kernels})
    print(f"would compile {len(kernels)} kernel instantiations of {len(files)} files ({', '.join(files)}) for the "
          f"current device", file=stream)


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of threads, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cupyconv.precompile",
                                     description="Compile every cupyconv kernel for the current GPU into CuPy's "
                                                 "disk cache.")
    parser.add_argument("--jobs", type=_jobs, default=os.cpu_count() or 1,
                        help="compiler threads (default: one per CPU core)")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the instantiations it would compile and exit (no GPU needed)")
    args = parser.parse_args(argv)
    if args.dry_run:
        dry_run(sys.stdout)
        return 0
    try:
        failed = precompile(args.jobs, sys.stdout)
    except Exception as error:   # no CuPy, no device, a shadowed toolkit: one line, not a traceback
        print(f"cupyconv.precompile: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
