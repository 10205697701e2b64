"""What a benchmark case launches on a GPU, found without one: the kernels and cuBLAS GEMMs of its real GPU path.

    python -m benchmarks.launches --cases r50-64-gpu16          # list them

`record(case, backward)` runs the case's cupyconv calls (`cases._cupyconv_call`, the very calls benchmarks.run
times) through the GPU path on `RecordingDevice`, a Device whose `launch` and `gemm_strided_batched` record their
arguments and execute nothing.  The planners see the case's real shapes, dtype and TF32 switch; autotuning is off,
so every pass runs the 'auto' heuristic's algorithm, as benchmarks.run's "cupyconv" contender does on a GPU (its
"cupyconv (autotune)" contender may measure another choice: `autotune_picks` says which).

Arrays are NumPy arrays from `numpy.empty`: a planner reads shapes, strides and dtypes, never values (tests check
that by recording the same case over NaN and over zeros), so their pages are never touched and the machine gives
them no memory; only the few host-side copies the GPU path makes (a contiguous copy, a depth window) are written.
Zero-strided placeholders would cost even less, but the planners look at strides (`batch_view`, contiguity) and
would plan other launches for them.

Array-library work between launches (CuPy's own copies, fills, casts, additions and reductions, e.g. a phased
input gradient's scatter, a 3-D problem's transposed output or a split weight gradient's sum) is recorded too, as
`ArrayWork` steps: every such operation of the GPU path goes through `Device.copyto`, `add` or `sum`, which the
recording device notes (with the bytes each operand's strides make it touch) before running them on NumPy.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import warnings
from dataclasses import dataclass, field

import numpy

from . import cases as cases_mod

UNRECORDED = ("array-library work between launches (CuPy copies, fills, casts, sums) is modelled as memory traffic "
              "only, from its operands' shapes and strides, not from CuPy's kernels")
SECTOR_BYTES = 32


@dataclass
class Launch:
    """One kernel launch as the planner made it.  `args`: {parameter name: value} in the C order; an array
    argument is described by `ArrayArg`; `raw_args` keeps the arguments as launched (for a counter run)."""
    source: str
    name: str
    grid: tuple
    block: tuple
    shared_mem: int
    args: dict
    raw_args: list = field(default_factory=list, repr=False)   # the C-ordered arguments, as launched

    @property
    def kernel(self) -> str:
        """The template's name: 'conv_fwd_tc<__half, int, 128, 64>' -> 'conv_fwd_tc'."""
        return self.name.split("<", 1)[0]

    @property
    def template_args(self) -> list[str]:
        """'conv_fwd_tc<__half, int, 128, 64>' -> ['__half', 'int', '128', '64']."""
        return [a.strip() for a in self.name.split("<", 1)[1].rstrip(">").split(",")] if "<" in self.name else []

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    def to_dict(self) -> dict:
        return {"source": self.source, "name": self.name, "grid": list(self.grid), "block": list(self.block),
                "shared_mem": self.shared_mem, "args": {k: (v.to_dict() if isinstance(v, ArrayArg) else v)
                                                        for k, v in self.args.items()}}


@dataclass(frozen=True)
class ArrayArg:
    """A pointer argument: the array's shape, dtype, bytes, and whether the kernel only reads it (`const T*`)."""
    shape: tuple
    dtype: str
    nbytes: int
    read_only: bool

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes, "read_only": self.read_only}


@dataclass(frozen=True)
class Gemm:
    """One cuBLAS cublasGemmStridedBatchedEx call (`Device.gemm_strided_batched`): m, n, k, batch, dtypes of A/B
    and C, and the compute type (`_device.gemm_compute`: TF32 or not)."""
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    out_dtype: str
    compute: str
    beta: float

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def bytes(self) -> int:
        """A and B read once, C written (and read too when beta != 0): the GEMM's compulsory traffic."""
        item, out = numpy.dtype(self.dtype).itemsize, cases_mod.numpy_dtype(self.out_dtype).itemsize
        c = self.m * self.n * self.batch * out
        return (self.m * self.k + self.k * self.n) * self.batch * item + c * (2 if self.beta else 1)

    def to_dict(self) -> dict:
        return {"m": self.m, "n": self.n, "k": self.k, "batch": self.batch, "dtype": self.dtype,
                "out_dtype": self.out_dtype, "compute": self.compute, "beta": self.beta, "flops": self.flops}


def touched_bytes(a) -> tuple[int, int]:
    """(compulsory, moved) bytes of walking array view a (or broadcast operand) once: its distinct elements, and
    the 32-byte sectors its innermost stride makes a walk touch (a stride over one element fetches a sector an
    element, up to the sector's size); 0-stride axes (broadcasts) count once."""
    a = numpy.asarray(a)
    distinct = math.prod(n for n, st in zip(a.shape, a.strides) if st != 0) if a.size else 0
    inner = abs(next((st for n, st in zip(reversed(a.shape), reversed(a.strides)) if n > 1 and st != 0),
                     a.itemsize))
    moved = distinct * (min(SECTOR_BYTES, inner) if inner > a.itemsize else a.itemsize)
    return distinct * a.itemsize, moved


@dataclass(frozen=True)
class ArrayWork:
    """One array-library operation between launches (`Device.copyto`, `add`, `sum`: a CuPy kernel of its own):
    kind ('copy', 'fill', 'add', 'sum'), elements written, and the bytes read and written, compulsory (each
    distinct element once) and moved (by the sectors the operands' strides touch)."""
    kind: str
    elements: int
    read_bytes: int
    write_bytes: int
    moved_read_bytes: int
    moved_write_bytes: int

    @staticmethod
    def of(kind: str, out, *inputs) -> "ArrayWork":
        written, moved_written = touched_bytes(out)
        reads = [touched_bytes(a) for a in inputs if hasattr(a, "shape")]
        if kind == "add":   # dst += src reads dst too
            reads.append((written, moved_written))
        return ArrayWork(kind, int(numpy.asarray(out).size), sum(r[0] for r in reads), written,
                         sum(r[1] for r in reads), moved_written)

    @property
    def compulsory_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    @property
    def moved_bytes(self) -> int:
        return self.moved_read_bytes + self.moved_write_bytes

    def to_dict(self) -> dict:
        return {"kind": self.kind, "elements": self.elements, "read_bytes": self.read_bytes,
                "write_bytes": self.write_bytes, "moved_bytes": self.moved_bytes}


@dataclass
class Recording:
    """Everything one case and pass launched, in order: kernel launches and GEMMs interleaved as `steps`."""
    case: str
    pass_: str
    steps: list = field(default_factory=list)   # Launch | Gemm | ArrayWork, in call order
    note: str = UNRECORDED

    @property
    def launches(self) -> list[Launch]:
        return [s for s in self.steps if isinstance(s, Launch)]

    @property
    def gemms(self) -> list[Gemm]:
        return [s for s in self.steps if isinstance(s, Gemm)]

    @property
    def array_work(self) -> list[ArrayWork]:
        return [s for s in self.steps if isinstance(s, ArrayWork)]


def _kernel_params(source: str, kernel: str):
    from cupyconv import _device
    return _device.kernel_files()[source].signatures[kernel]


class RecordingDevice:
    """A `cupyconv._device.Device` that records each kernel launch and GEMM and runs nothing (built lazily so that
    importing this module does not import cupyconv)."""

    def __new__(cls):
        from cupyconv import _device

        class _Recorder(_device.Device):
            name = "recording"
            xp = numpy
            tensor_cores = True   # sm_90 has mma.sync
            wgmma = True          # H100 and H200 are 9.0 GPUs: sm_90a (ops/wgmma_gemm.py)

            def __init__(self):
                self.steps: list = []

            def launch(self, source, name, grid, block, args, shared_mem=0):
                params = _kernel_params(source, name.split("<", 1)[0])
                named = {}
                for param, value in zip(params, args):
                    if isinstance(value, numpy.ndarray):
                        named[param.name] = ArrayArg(tuple(value.shape), value.dtype.name, int(value.nbytes),
                                                     param.type.startswith("const"))
                    else:
                        named[param.name] = value.item() if hasattr(value, "item") else value
                self.steps.append(Launch(source, name, tuple(int(g) for g in grid), tuple(int(b) for b in block),
                                         int(shared_mem), named, list(args)))

            def gemm_strided_batched(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                                     beta, c, ldc, stride_c, batch):
                m, n, k, *_, batch = _device.gemm_arguments(transa, transb, m, n, k, a, lda, stride_a, b, ldb,
                                                           stride_b, c, ldc, stride_c, batch)
                self.steps.append(Gemm(m, n, k, batch, a.dtype.name, c.dtype.name, _device.gemm_compute(a.dtype)[0],
                                       float(beta)))

            def copyto(self, dst, src) -> None:   # src read as it lies: a broadcast reads its elements once
                if dst.size:
                    array = numpy.ndim(src) > 0
                    self.steps.append(ArrayWork.of("copy" if array else "fill", dst, *((src,) if array else ())))
                super().copyto(dst, src)

            def add(self, dst, src) -> None:
                if dst.size:
                    self.steps.append(ArrayWork.of("add", dst, src))
                super().add(dst, src)

            def sum(self, a, axis, dtype):
                out = super().sum(a, axis, dtype)
                if a.size:
                    self.steps.append(ArrayWork.of("sum", out, a))
                return out

            def arrival_counters(self, size):
                # kept per stream and zeroed once (`Device.arrival_counters`), not per call: its fill is no step
                return numpy.zeros(max(size, _device.ARRIVALS_LEAST), numpy.int32)

        return _Recorder()


def empty_inputs(case: cases_mod.Case, fill=None) -> dict:
    """The case's x, w, b and gy as NumPy arrays of its shapes and dtype, uninitialised (fill: a value for all)."""
    dtype = cases_mod.numpy_dtype(case.dtype)
    shapes = cases_mod.shapes(case)
    arrays = {"x": shapes["x"], "w": shapes["w"], "b": shapes["b"], "gy": shapes["y"]}
    out = {}
    for name, shape in arrays.items():
        if shape is None:
            out[name] = None
            continue
        out[name] = numpy.empty(shape, dtype)
        if fill is not None:
            out[name].fill(fill)
    return out


@contextlib.contextmanager
def forced_choices(choices: dict[str, str]):
    """Within: an 'auto' pass named in choices ({"forward" | "grad_input" | "grad_weight": algorithm}) runs that
    algorithm where it is a candidate, as if autotuning had picked it: a GPU run's autotuned plan, recorded to be
    modelled (benchmarks.calibrate's profiles ran with autotuning on).  Other passes keep the heuristic's choice."""
    from cupyconv import _autotune
    original = _autotune.resolve

    def resolve(device, key, algorithm, candidates, heuristic, run):
        chosen = choices.get(key[0])
        if algorithm == "auto" and chosen in candidates:
            return run(chosen)
        return original(device, key, algorithm, candidates, heuristic, run)
    _autotune.resolve = resolve
    try:
        yield
    finally:
        _autotune.resolve = original


def autotune_picks(fn) -> list[dict]:
    """What 'auto' ran in each pass of fn's calls, found by running fn once more with its passes resolved again
    (the launch replay and the fast path off for that call, `CUPYCONV_REPLAY=0`): per pass, in order, {"pass",
    "algorithm" (what ran), "heuristic" (what 'auto' runs with autotuning off), "candidates_us" (each candidate's
    timed GPU time where autotuning measured it, else None)}.  Call fn once before, with the settings it is timed
    under, so that autotuning has made its choices."""
    import os

    from cupyconv import _autotune, settings
    original = _autotune.resolve
    picks: list[dict] = []

    def resolve(device, key, algorithm, candidates, heuristic, run):
        picks.append({"pass": key[0], "algorithm": _autotune.chosen(device, key, algorithm, candidates, heuristic),
                      "heuristic": _autotune._preferred(candidates, heuristic)})
        result = original(device, key, algorithm, candidates, heuristic, run)
        tuning = algorithm == "auto" and settings.get_autotune() and not settings.get_deterministic()
        measured = _autotune.MEASURED.get((*key, device.key())) if tuning else None
        if picks[-1]["algorithm"] is None:   # measured by this very call (fn was not called before)
            picks[-1]["algorithm"] = _autotune.CACHE.get((*key, device.key()))
        picks[-1]["candidates_us"] = None if measured is None else {c: s * 1e6 for c, s in measured.items()}
        return result
    saved = os.environ.get("CUPYCONV_REPLAY")
    os.environ["CUPYCONV_REPLAY"] = "0"
    _autotune.resolve = resolve
    try:
        fn()
    finally:
        _autotune.resolve = original
        if saved is None:
            del os.environ["CUPYCONV_REPLAY"]
        else:
            os.environ["CUPYCONV_REPLAY"] = saved
    return picks


def record(case: cases_mod.Case, backward: bool, inputs: dict | None = None,
           choices: dict[str, str] | None = None) -> Recording:
    """The launches and GEMMs of one case and pass ("fwd" or "fwd+bwd") on its GPU path, with 'auto' choices
    (or those of `choices`, see `forced_choices`)."""
    import cupyconv
    from cupyconv import _device, settings
    device = RecordingDevice()
    arrays = empty_inputs(case) if inputs is None else inputs
    run = cases_mod._cupyconv_call(case, arrays, backward)
    with contextlib.ExitStack() as stack:
        if choices:
            stack.enter_context(forced_choices(choices))
        stack.enter_context(_device.use_device(device))
        stack.enter_context(settings.autotune(False))
        stack.enter_context(settings.allow_tf32(case.tf32))
        stack.enter_context(numpy.errstate(all="ignore"))   # host-side arithmetic on uninitialised arrays
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", RuntimeWarning)
        run()
    del cupyconv
    return Recording(case.label, "fwd+bwd" if backward else "fwd", device.steps)


def describe(step) -> str:
    if isinstance(step, ArrayWork):
        return (f"array {step.kind} of {step.elements} elements, {step.read_bytes} B read, {step.write_bytes} B "
                f"written")
    if isinstance(step, Gemm):
        return (f"cuBLAS GEMM m={step.m} n={step.n} k={step.k} batch={step.batch} {step.dtype}->{step.out_dtype} "
                f"{step.compute}")
    return f"{step.name} grid {step.grid} block {step.block} shared {step.shared_mem} B"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated GPU case labels or tags (default: all)")
    args = parser.parse_args(argv)
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    for case in cases_mod.select(wanted, ("gpu",)):
        for backward in (False, True):
            rec = record(case, backward)
            print(f"{case.label} {rec.pass_}:")
            for step in rec.steps:
                print("   ", describe(step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
