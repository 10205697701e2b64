"""The host (Python) cost of cupyconv's GPU calls, measured on the CPU: no GPU, no kernels, no cuBLAS.

    python -m benchmarks.host_overhead [--cases r50-64-gpu16,iii-gpu32] [--calls 30] [--top 25] [--torch]

The first GPU run (2026-11-26, H200) found every GPU call host-bound: 170-800 us of Python per forward call
against 9-80 us of kernels.  This instrument runs the GPU cases' cupyconv calls (`cases._cupyconv_call`, the
calls `benchmarks.host_profile` times on the GPU) on `NullGpu`: tests/emulator's CupyHostDevice (cupyconv's own
`CudaDevice` over real `cupy.ndarray` objects) whose memory, array work, kernels and cuBLAS are no-ops, so that
everything left is the host work of cupyconv's GPU path.  The arrays are cupy.ndarrays of the cases' real shapes
over memory that is never touched (no bytes allocated), so the planners see the real problems.

For each case and pass it prints
  calls      Python function calls per call (cProfile's count: Python functions and C builtins), deterministic:
             the figure to compare before/after a change, and what tests/test_host_overhead.py bounds
  above      of those, the calls made outside ops/lift.py's `forward`/`backward` drivers and `_replay.Program.run`
             (the public entry point, `Call`, the spec parsing, wrapping; for a repeated call on the fast path
             (`cupyconv._fastpath`), its signature and lookup): what the launch replay does not do
  cupyconv   the calls of functions defined in cupyconv/ (the rest are NumPy, CuPy and builtins)
  host_us    wall clock per call on this CPU, best of 3 runs of `calls` calls: a PREDICTION of the trend of the
             GPU host's figure, not of the figure itself (another CPU; no real CuPy launches or allocations)

Autotuning is off (the model's 'auto' choice, the same on every run).  --autotune turns it on with every
candidate timed alike (NullGpu runs nothing to time), so that autotuning keeps the heuristic's pick (ties go to it:
`cupyconv._autotune.keep`) and the figures are those of the autotuned path once its choice is cached: the first
call measures, the second records, the third and later take the fast path, as without autotuning.  The first H100
run (2026-11-26) timed the benchmark's calls (autotune on) 1.3-1.7x above host_profile's (autotune off) on
cases with and without an autotuned pass alike; here both count the same calls, launches and allocations.

--torch runs the calls a torch user makes instead (`cases.build_cupyconv_torch`, the 'cupyconv.torch (autograd)'
contender of benchmarks.run: cupyconv.torch's functional ops, torch.no_grad for a forward, torch.autograd.grad for
forward+backward), on real torch CPU tensors of the case's shapes taken down the CUDA branch of cupyconv.torch by
fakes at its device seams (`TORCH_FAKES`, printed with the table; their own calls are not counted): everything
else -- torch's custom-op dispatch and autograd, the functional wrappers, the op bodies, `cuda_context`, `Call`'s
torch bridging, the drivers on NullGpu -- is the real code.  The H200 measured this path 3.5-10x slower per call
than the plain functions on CuPy arrays (benchmarks/results/gpu-2026-11-26/after-fixes/bench.json).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import gc
import math
import pstats
import sys
import time
import warnings
from pathlib import Path

import numpy

from benchmarks import _emulator
from benchmarks import cases as cases_mod

DEFAULT_CASES = ("r50-64-gpu16", "r50-64-gpu32", "p-seed-gpu16", "iii-gpu32", "dw-480-14-gpu16", "iv-gpu16")
PACKAGE = str(Path(__file__).resolve().parents[1] / "cupyconv")
# The drivers (cupyconv/ops/lift.py) and a replay (which a repeated call reaches from `_fastpath`, not the drivers)
SEAM = (("ops/lift.py", "forward"), ("ops/lift.py", "backward"), ("_replay.py", "run"))


# The scalar types CuPy's launch wraps one by one, on every launch (`_device._SCALARS`; exact types: no call to count)
_WRAPPED = frozenset({bool, int, float, complex, numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.uint8,
                      numpy.uint16, numpy.uint32, numpy.uint64, numpy.float16, numpy.float32, numpy.float64,
                      numpy.bool_})


class _NullKernel:
    """A compiled kernel as `CudaDevice.launch` uses it (CuPy's RawKernel), whose launch does nothing but count
    "launches" and "scalars" -- the scalar arguments CuPy wraps for the launch, none of a prepared launch's
    (`_device._packed`) -- and wrap those as CuPy's launch would (`CScalar`, about half a microsecond each on this
    CPU: its cost shows in host_us; cProfile counts no call for it).  `kernel` is its per-device `Function`, which a
    prepared launch calls."""
    max_dynamic_shared_size_bytes = 48 * 1024

    def __init__(self, counts: dict):
        from cupyconv import _device
        self.counts, self.wrap = counts, _device._scalar_wrapper() or (lambda a: a)

    @property
    def kernel(self):
        return self

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        counts, wrap = self.counts, self.wrap
        counts["launches"] += 1
        for a in args:
            if type(a) in _WRAPPED:
                counts["scalars"] += 1
                wrap(a)


def null_gpu():
    """A CupyHostDevice whose memory, array work, kernels and cuBLAS do nothing (built lazily: it needs the test
    emulator package).  Its `counts` tally what would reach CuPy on a GPU, each with a host cost of its own there:
    "launches" (raw kernels, cuBLAS GEMMs and CuPy's array work: each one kernel launch) and "allocations"."""
    emulator = _emulator.emulator()
    from emulator._device import EmulatedCublas

    class NullCublas(EmulatedCublas):
        def __init__(self, counts: dict):
            super().__init__()
            self.counts = counts

        def gemmStridedBatchedEx(self, *args):
            self.counts["launches"] += 1

    class NullGpu(emulator.CupyHostDevice):
        name = "null-gpu"
        wgmma = True   # the plans benchmarks.launches records for an H100/H200 (conv_fwd_wgmma opted in)

        def __init__(self):
            super().__init__()
            self.counts = {"launches": 0, "allocations": 0, "scalars": 0}
            self.blas = NullCublas(self.counts)
            self.kernel = _NullKernel(self.counts)
            self._next = 1 << 40   # fake device addresses, never read: each array its own range

        def empty(self, shape, dtype):
            cupy = self.xp
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            dtype = numpy.dtype(dtype)
            nbytes = max(math.prod(shape) * dtype.itemsize, 1)
            self.counts["allocations"] += 1
            memory = cupy.cuda.UnownedMemory(self._next, nbytes, None, device_id=0)
            self._next += -(-nbytes // 256) * 256 + 256
            return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))

        def copyto(self, dst, src) -> None:
            self.counts["launches"] += 1

        def add(self, dst, src) -> None:
            self.counts["launches"] += 1

        def sum(self, a, axis, dtype):
            self.counts["launches"] += 1
            axes = (axis,) if isinstance(axis, int) else tuple(axis)
            return self.empty(tuple(s for i, s in enumerate(a.shape) if i not in axes), dtype)

        def function(self, source, name):
            return self.kernel

    return NullGpu()


def null_inputs(device, case: cases_mod.Case) -> dict:
    """The case's x, w, b and gy of its shapes and dtype from `device`'s empty(shape, dtype): cupy.ndarrays on a
    NullGpu (nothing allocated), or NumPy arrays with `numpy` (never read: --torch's tensors are made of them)."""
    shapes = cases_mod.shapes(case)
    dtype = cases_mod.numpy_dtype(case.dtype)
    return {name: None if shapes[key] is None else device.empty(shapes[key], dtype)
            for name, key in (("x", "x"), ("w", "w"), ("b", "b"), ("gy", "y"))}


def _tie(run):
    """NullGpu's `timed` under --autotune: every candidate takes the same (no) time."""
    return 0.0, run()


@contextlib.contextmanager
def on_null_gpu(device, case: cases_mod.Case, autotune: bool = False):
    """The settings the calls run under: the case's TF32, autotuning off (or on, every candidate timed alike: see
    --autotune), `device` for CuPy arrays.  The autotuning cache is left as it was found."""
    from cupyconv import _autotune, _device, settings
    saved = [(cache, dict(cache)) for cache in (_autotune.CACHE, _autotune.MEASURED)]
    if autotune:
        device.timed = _tie
    with contextlib.ExitStack() as stack:
        for cache, entries in saved:
            stack.callback(lambda cache=cache, entries=entries: (cache.clear(), cache.update(entries)))
        stack.enter_context(_device.use_device(device))
        stack.enter_context(settings.autotune(autotune))
        stack.enter_context(settings.allow_tf32(case.tf32))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def build(case: cases_mod.Case, backward: bool, torch: bool = False):
    """(device, fn): the case-pass's cupyconv calls as a function of no arguments on a fresh NullGpu; torch: through
    cupyconv.torch on torch CPU tensors (run them inside `torch_on_null_gpu`)."""
    device = null_gpu()
    if torch:
        return device, cases_mod.build_cupyconv_torch(dataclasses.replace(case, device="cpu"),
                                                      null_inputs(numpy, case), backward)
    return device, cases_mod._cupyconv_call(case, null_inputs(device, case), backward)


#: What --torch fakes, each a stand-in for a call that needs CUDA (not counted: `count_calls` subtracts the calls made
#: inside these functions, themselves included).
TORCH_FAKES = (
    "cupyconv.torch.cpu.runs_on_torch -> False (CPU tensors not sent to torch's CPU convolutions)",
    "cupyconv._arrays._device_of(torch tensor) -> 'cuda:0'; cupyconv.torch.cuda.DEVICE_TYPE = 'cpu' (a CPU tensor "
    "takes cuda_context's CUDA branch, for device 0)",
    "torch.cuda.current_device -> 0; torch's current stream handle (cupyconv.torch.cuda._raw_stream) -> a fixed int",
    "cupy.cuda.Device(i) and the CuPy stream object over torch's stream -> context managers that do nothing (CuPy "
    "needs a driver to enter them); the allocator over torch's caching allocator is real (never asked: NullGpu "
    "allocates nothing)",
    "cupy.from_dlpack(tensor) -> a cupy.ndarray over the tensor's host memory (device id 0)",
    "torch.from_dlpack(cupy array) -> a new view of a torch CPU tensor of its shape, strides and dtype, one per "
    "layout (NullGpu's memory is never real)",
)


class _NoDriverContext:
    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fake_runs_on_torch(x, weight):
    return False


def _fake_current_device():
    return 0


def _fake_current_stream(device_index):
    return 0x5EED


def _fake_cupy_stream(cupy, stream):
    return _NoDriverContext()


def _fake_cupy_from_dlpack(t):
    import cupy
    itemsize = t.element_size()
    memory = cupy.cuda.UnownedMemory(t.data_ptr(), max(t.untyped_storage().nbytes(), 1), t, device_id=0)
    dtype = cases_mod.numpy_dtype(str(t.dtype).replace("torch.", ""))
    return cupy.ndarray(tuple(t.shape), dtype, cupy.cuda.MemoryPointer(memory, t.storage_offset() * itemsize),
                        strides=tuple(s * itemsize for s in t.stride()))


def _fake_torch_from_dlpack(a):
    import torch
    if isinstance(a, torch.Tensor):
        return a
    key = (a.shape, a.strides, a.dtype)
    base = _FAKE_OUTPUTS.get(key)
    if base is None:   # one torch CPU allocation per layout, so that timing does not measure torch's CPU allocator
        strides = tuple(s // a.itemsize for s in a.strides)
        base = _FAKE_OUTPUTS[key] = torch.empty_strided(a.shape, strides, dtype=getattr(torch, a.dtype.name))
    return base.view(base.shape)   # a new tensor object each time, as from_dlpack gives


_FAKE_OUTPUTS: dict = {}


_FAKE_CODES = frozenset(f.__code__ for f in (_fake_runs_on_torch, _fake_current_device, _fake_current_stream,
                                            _fake_cupy_stream, _fake_cupy_from_dlpack, _fake_torch_from_dlpack,
                                            _NoDriverContext.__init__, _NoDriverContext.__enter__,
                                            _NoDriverContext.__exit__))


@contextlib.contextmanager
def torch_on_null_gpu():
    """The fakes of `TORCH_FAKES`, for the block (the `_device_of` one is added in `_fake_device_of`)."""
    import cupy
    import torch

    from cupyconv import _arrays
    from cupyconv.torch import cpu, cuda
    real_device_of = _arrays._device_of

    def _fake_device_of(a, kind=None):
        kind = kind or _arrays._kind(a)
        return "cuda:0" if kind == "torch" else real_device_of(a, kind)

    fakes = [(cpu, "runs_on_torch", _fake_runs_on_torch), (_arrays, "_device_of", _fake_device_of),
             (cuda, "DEVICE_TYPE", "cpu"), (torch.cuda, "current_device", _fake_current_device),
             (cuda, "_raw_stream", _fake_current_stream), (cupy.cuda, "Device", _NoDriverContext),
             (cuda, "_cupy_stream", _fake_cupy_stream), (cupy, "from_dlpack", _fake_cupy_from_dlpack),
             (torch, "from_dlpack", _fake_torch_from_dlpack)]
    global _FAKE_CODES_ALL
    _FAKE_CODES_ALL = _FAKE_CODES | {_fake_device_of.__code__}
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in fakes]
    try:
        for owner, name, fake in fakes:
            setattr(owner, name, fake)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        _FAKE_CODES_ALL = _FAKE_CODES


_FAKE_CODES_ALL = _FAKE_CODES


def count_calls(fn, calls: int) -> tuple[pstats.Stats, dict]:
    """cProfile of `calls` calls of fn, and per call: {"calls": all, "above": outside the seam, "cupyconv":
    of functions in cupyconv/}."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = cupyconv = 0
    for (filename, _, name), (_, ncalls, _, _, _) in stats.stats.items():
        total += ncalls
        if filename.startswith(PACKAGE):
            cupyconv += ncalls
    below, faked = _calls_below_seam(fn, calls)
    total -= faked
    return stats, {"calls": total / calls, "above": (total - below) / calls, "cupyconv": cupyconv / calls}


def _calls_below_seam(fn, calls: int) -> tuple[int, int]:
    """Function calls (Python and C, as cProfile counts them) made inside lift.forward/backward or a replay
    (`SEAM`), the seam itself included; and those made inside the fakes of --torch (`TORCH_FAKES`), the fakes
    included, which are not counted."""
    seam = {(name, f"{PACKAGE}/{file}") for file, name in SEAM}
    counts = {"seam": [0, 0], "fake": [0, 0]}   # [depth, calls] inside each

    def tracer(frame, event, arg):
        if event == "call":
            code = frame.f_code
            for name, inside in (("seam", (code.co_name, code.co_filename) in seam), ("fake", code in fakes)):
                depth = counts[name]
                if depth[0] or inside:
                    depth[0] += 1
                    depth[1] += 1
        elif event == "return":
            for depth in counts.values():
                if depth[0]:
                    depth[0] -= 1
        elif event == "c_call":
            for depth in counts.values():
                if depth[0]:
                    depth[1] += 1

    fakes = _FAKE_CODES_ALL
    sys.setprofile(tracer)
    try:
        for _ in range(calls):
            fn()
    finally:
        sys.setprofile(None)
    return counts["seam"][1], counts["fake"][1]


def host_us(fn, calls: int) -> float:
    """Wall-clock microseconds per call, best of three runs of `calls` calls."""
    best = float("inf")
    for _ in range(3):
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - begin)
    return best / calls * 1e6


def measure(case: cases_mod.Case, backward: bool, calls: int = 30, timing: bool = True,
            choices: dict[str, str] | None = None, torch: bool = False,
            autotune: bool = False) -> tuple[dict, pstats.Stats]:
    """The figures of the module's docstring for one case-pass, and launches and allocations per call (what
    CuPy would be asked for on a GPU); `choices` forces algorithms as `benchmarks.launches.forced_choices` does
    (an autotuned GPU run's plan); torch: through cupyconv.torch (see --torch); autotune: see --autotune."""
    from benchmarks import launches
    device, fn = build(case, backward, torch)
    with on_null_gpu(device, case, autotune), launches.forced_choices(choices or {}), \
            (torch_on_null_gpu() if torch else contextlib.nullcontext()):
        for _ in range(3):   # warm: the memoised signatures, plans and kernels
            fn()
        before = dict(device.counts)
        fn()
        counted = {key: device.counts[key] - before[key] for key in before}
        stats, figures = count_calls(fn, calls)
        figures.update(counted)
        if timing:
            figures["host_us"] = host_us(fn, calls)
    return figures, stats


def counts(case: cases_mod.Case, backward: bool, choices: dict[str, str] | None = None, calls: int = 10) -> dict:
    """Per call, deterministic and cheap (no timing, no seam tracing): {"calls": Python function calls as
    cProfile counts them, "launches", "allocations"} -- what `benchmarks.predict`'s host model reads."""
    from benchmarks import launches
    device, fn = build(case, backward)
    with on_null_gpu(device, case), launches.forced_choices(choices or {}):
        for _ in range(2):   # warm: the memoised signatures, plans and kernels
            fn()
        before = dict(device.counts)
        # A collection inside the profiled calls would count finalisers of other code's garbage (an earlier test's
        # arrays, under pytest-xdist): collect first and keep the collector off while counting.
        collecting = gc.isenabled()
        gc.collect()
        gc.disable()
        profiler = cProfile.Profile()
        try:
            profiler.enable()
            for _ in range(calls):
                fn()
            profiler.disable()
        finally:
            if collecting:
                gc.enable()
    total = sum(ncalls for _, ncalls, _, _, _ in pstats.Stats(profiler).stats.values())
    return {"calls": round(total / calls, 1), **{key: (device.counts[key] - before[key]) / calls for key in before}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated GPU case labels or tags")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--top", type=int, default=0, help="also print cProfile's top N functions by call count")
    parser.add_argument("--torch", action="store_true",
                        help="the calls through cupyconv.torch (autograd) on torch tensors, CUDA faked (see above)")
    parser.add_argument("--autotune", action="store_true",
                        help="autotuning on, every candidate timed alike (the heuristic's pick kept, see above)")
    args = parser.parse_args(argv)
    rows = []
    if args.torch:
        print("cupyconv.torch on torch CPU tensors down the CUDA branch; faked, and not counted:")
        print("\n".join(f"- {fake}" for fake in TORCH_FAKES) + "\n")
    print("| case-pass | calls/call | above the drivers and replay | in cupyconv/ | launches | allocations "
          "| host us/call (this CPU, prediction) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in cases_mod.select(args.cases.split(","), ("gpu",)):
        for backward in (False, True):
            name = (f"{case.label}-{'fwdbwd' if backward else 'fwd'}{'-torch' if args.torch else ''}"
                    f"{'-autotune' if args.autotune else ''}")
            figures, stats = measure(case, backward, args.calls, torch=args.torch, autotune=args.autotune)
            rows.append(f"| {name} | {figures['calls']:.0f} | {figures['above']:.0f} | {figures['cupyconv']:.0f} | "
                        f"{figures['launches']:.0f} | {figures['allocations']:.0f} | {figures['host_us']:.0f} |")
            print(rows[-1], flush=True)
            if args.top:
                stats.sort_stats("ncalls").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
