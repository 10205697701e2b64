"""The kernels' resource use, read from their SASS, against the launches the planners make; no GPU needed.

Every instantiation with 32-bit indices and a representative subset of their 64-bit twins are compiled by NVRTC
(CUDA 13) to a cubin for sm_90, and a representative subset of those with 32-bit indices for sm_80
(test_nvrtc.sass_names) -- the very programs tests/test_nvrtc.py checks, compiled once per session
(`kernel_programs`) -- and `cuobjdump -res-usage` reads each kernel's registers, static shared memory, stack frame
and local memory (of the others, compiled fast, their static shared memory only: `register_bound`); the loop checks
read the optimised ones.  The launches come from running the public ops on `RecordingDevice`, a Device that records
every launch (kernel, block, dynamic shared memory) and executes nothing, over the GPU benchmark cases of benchmarks/cases.py and the emulator tests' cases, forward and
backward, in every dtype, with every algorithm, for both index types.  Each launch must fit the hardware
(`launch_problems`):

- registers: warps x 32 x registers per thread, rounded up to the allocation unit, within the 64 Ki registers a
  block may use;
- shared memory: static + dynamic within 48 KiB, or, when the dynamic part alone is above 48 KiB (the launch then
  opts in, as CudaDevice.launch does), within the architecture's opt-in limit;
- no stack frame or local memory (register spills) in the float16, bfloat16 and float32 kernels, launched or
  not (float64 kernels may spill).

`opcodes_of` counts every kernel's SASS instructions (nvdisasm), for checks on what a kernel compiles to, e.g.
that a tensor-core instantiation has matrix instructions:
`opcodes_of("implicit_gemm.cu", arch, kernel_programs)["conv_fwd_tc<__half, int, 64, 64>"]["HMMA"] > 0`.

The reading of the binaries (NVRTC, cuobjdump, nvdisasm, `main_loop`, `occupancy`) is `benchmarks/sass.py`, a
library benchmarks.predict uses too; this file holds the checks.  Needs the wheels of the compile-check extra: nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm (all >=13,<14); skips without them.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from cupyconv import _device, _kernels, settings
from reference import NEEDS, NEEDS_SUBSETS
# kernel_programs: the session's compiled programs (a fixture); on_program: their pytest-xdist groups
from test_nvrtc import (GROUPS, compile_async_copy_check, kernel_programs,  # noqa: F401
                        FULL_ARCHES, fast_names, index_type, on_program, program_params, sass_names,
                        template_args, variant)

from benchmarks import sass
from benchmarks.sass import Usage, main_loop_opcodes, parse_res_usage, resource_usage, sass_opcodes

SASS_ARCHES = ("sm_80", "sm_90")  # sm_80: representatives of the 32-bit-index instantiations (test_nvrtc.sass_names)

# Per-block hardware limits of sm_80 and sm_90 (CUDA C Programming Guide, compute capabilities 8.0 and 9.0).
MAX_THREADS = 1024
REGISTERS_PER_BLOCK = 65536
MAX_REGISTERS_PER_THREAD = 255
# Registers are allocated per warp in units of 256: a thread's count rounded up to a multiple of 8, times 32
# lanes, for every warp the block has (its threads rounded up to a multiple of 32).
REGISTER_UNIT_PER_THREAD = 8
SHARED_WITHOUT_OPT_IN = _device.DEFAULT_SHARED_LIMIT            # 48 KiB, static + dynamic
SHARED_OPT_IN = {"sm_80": 163 * 1024, "sm_90": 227 * 1024}     # cudaDevAttrMaxSharedMemoryPerBlockOptin
SPILL_FREE_TYPES = ("__half", "__nv_bfloat16", "float")
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32,
          "float64": numpy.float64})


# ---------------------------------------------------------------------------------------------------------
# The binaries: resource use and instructions per kernel (benchmarks/sass.py, which benchmarks.predict uses too)


@pytest.fixture
def sass_tools():
    """Skips the test where cuobjdump or nvdisasm is not installed."""
    try:
        sass.tool("cuobjdump"), sass.tool("nvdisasm")
    except sass.ToolMissing as e:
        pytest.skip(str(e))


def element_type(name: str) -> str:
    """'depthwise_fwd<__half, int, 3, 1>' -> '__half'."""
    return template_args(name)[0]


# ---------------------------------------------------------------------------------------------------------
# The launches the planners make


@dataclass(frozen=True)
class Launch:
    source: str
    name: str       # name expression
    block: tuple
    shared_mem: int  # dynamic shared memory, bytes

    @property
    def threads(self) -> int:
        return math.prod(self.block)


class RecordingDevice(_device.Device):
    """Runs an op's GPU path on NumPy arrays without executing anything: every kernel launch is recorded
    (with the case that made it), GEMMs return uninitialised results of the right shape."""

    name = "recording"
    xp = numpy
    tensor_cores = True  # sm_80 and sm_90 both have mma.sync
    wgmma = True  # as an H100/H200 (sm_90a): the benchmark cases' large 16-bit forwards launch conv_fwd_wgmma

    def __init__(self):
        self.launches: dict[Launch, str] = {}  # launch -> the first case that made it
        self.case = ""

    def launch(self, source, name, grid, block, args, shared_mem=0):
        self.launches.setdefault(Launch(source, name, tuple(int(b) for b in block), int(shared_mem)), self.case)

    def matmul(self, a, b, out=None):
        if out is not None:
            return out
        shape = (*numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
        return numpy.empty(shape, a.dtype)

    def gemm_strided_batched(self, *args, **kwargs):
        """cuBLAS's strided batched GEMM (`Device.gemm_strided_batched`): not run either."""


OPS = {  # op -> (forward, backward, its module's algorithms or None)
    "conv2d": (cupyconv.conv2d, cupyconv.conv2d_backward, "conv"),
    "patch": (cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward, "patch"),
    "depthwise": (cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, None),
}


def _algorithms(module: str | None) -> tuple:
    if module is None:
        return ("auto",)
    return getattr(sys.modules[f"cupyconv.ops.{module}"], "ALGORITHMS", ("auto",))


def run_conv(device, op: str, x, weight, bias, window: dict, grad_output=None, skip=(), needs=(NEEDS,)):
    """Forward and backward (for each set of gradients in `needs`) of op on the recording device, with 'auto'
    and with each algorithm the op offers but those in `skip` (an algorithm that refuses the problem is skipped
    too)."""
    forward, backward, module = OPS[op]
    for algorithm in _algorithms(module):
        if algorithm in skip:
            continue
        extra = {} if module is None else {"algorithm": algorithm}
        try:
            y = forward(x, weight, bias, **window, **extra)
            gy = numpy.empty_like(y) if grad_output is None else grad_output
            for subset in needs:
                backward(gy, x, weight, **window, **extra, needs=subset)
        except ValueError:
            if algorithm == "auto":
                raise


# Not forced on the benchmark shapes ('auto' still runs it where it picks it): at these sizes im2col_gemm's NumPy
# side (bias added to the output, sums over GEMM products) takes seconds here, and its kernels (unfold, fold: a
# 256-thread elementwise block) launch alike at every size; the emulator cases force it.
BENCHMARK_SKIPS = ("im2col_gemm",)


def benchmark_calls():
    """(label, function of (device, dtype)) for every GPU problem of benchmarks/cases.py."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # `pytest` (not `python -m pytest`) leaves the checkout off the path
        sys.path.append(root)
    from benchmarks.cases import CASES

    problems = {}
    for case in CASES:
        if case.device == "gpu":
            problems.setdefault((case.op, tuple(sorted(case.dims.items()))), case.label.rsplit("-gpu", 1)[0])
    for (op, dims), label in problems.items():
        d = dict(dims)
        k, g = d["k"], d.get("g", 1)
        window = dict(stride=d.get("s", 1), padding=d["p"])

        def call(device, dtype, op=op, d=d, k=k, g=g, window=window):
            # Uninitialised arrays: nothing runs, and the big ones are never touched.
            if op == "unfold":
                x = numpy.empty((d["N"], d["C"], d["H"], d["W"]), dtype)
                cols = cupyconv.unfold(x, k, **window)
                cupyconv.unfold_backward(numpy.empty_like(cols), (d["H"], d["W"]), k, **window)
                return
            if op == "patch":
                x, w = (d["B"], d["N"], d["C"], d["H"], d["W"]), (d["D"], d["C"] // g, k, k)
            elif op == "depthwise":
                cm = d["C"] * d.get("m", 1)
                x, w = (d["N"], d["C"], d["H"], d["W"]), (cm, 1, k, k)
            else:
                x, w = (d["N"], d["C"], d["H"], d["W"]), (d["D"], d["C"] // g, k, k)
            groups = {} if op == "depthwise" else {"groups": g}
            run_conv(device, op, numpy.empty(x, dtype), numpy.empty(w, dtype), numpy.empty(w[:1], dtype),
                     dict(window, **groups), skip=BENCHMARK_SKIPS)
        yield f"benchmark {label}", call


def emulator_test_calls():
    """(label, function of (device, dtype)) for the cases of the emulator tests (tests/test_*_kernels.py)."""
    import test_conv_kernels
    import test_depthwise_kernels
    import test_lift_kernels
    import test_patch_kernels
    import test_unfold_kernels
    from cupyconv.ops import patch

    rng = numpy.random.default_rng(0)
    for case in test_conv_kernels.CASES:
        def call(device, dtype, case=case):
            x, w, b, gy = case.inputs(rng, dtype)
            run_conv(device, "conv2d", x, w, b, case.kwargs, gy, needs=NEEDS_SUBSETS)
        yield f"test_conv_kernels {case.name}", call
    for case in test_patch_kernels.CASES:
        def call(device, dtype, case=case):
            x, w, b, gy = case.inputs(rng, dtype)
            previous, patch.MIN_BLOCKS = patch.MIN_BLOCKS, 1  # as test_patch_kernels runs them
            try:
                run_conv(device, "patch", case.make_view(x), w, b, case.kwargs, gy, needs=NEEDS_SUBSETS)
            finally:
                patch.MIN_BLOCKS = previous
        yield f"test_patch_kernels {case.name}", call
    for case in test_depthwise_kernels.CASES:
        def call(device, dtype, case=case):
            c = case.x[1]
            x = numpy.empty(case.x, dtype)
            w = numpy.empty((c * case.m, 1, *case.kernel), dtype)
            run_conv(device, "depthwise", x, w, numpy.empty((c * case.m,), dtype) if case.bias else None,
                     case.window, needs=NEEDS_SUBSETS)
        yield f"test_depthwise_kernels {case.name}", call
    for shape, kernel, dilation, padding, stride in test_unfold_kernels.CASES:
        def call(device, dtype, shape=shape, kernel=kernel, window=dict(dilation=dilation, padding=padding,
                                                                         stride=stride)):
            cols = cupyconv.unfold(numpy.empty(shape, dtype), kernel, **window)
            cupyconv.unfold_backward(numpy.empty_like(cols), shape[-2:], kernel, **window)
        yield f"test_unfold_kernels {shape}", call
    for shape, kd, stride, dilation, padding, _ in test_lift_kernels.CASES:
        def call(device, dtype, shape=shape, kd=kd, window=dict(stride=stride, dilation=dilation,
                                                                   padding=(padding, (0, 0), (0, 0)))):
            x, w = numpy.empty(shape, dtype), numpy.empty((2, shape[1], kd, 1, 1), dtype)
            y = cupyconv.conv3d(x, w, **window)
            cupyconv.conv3d_backward(numpy.empty_like(y), x, w, needs=("input", "weight"), **window)
        yield f"test_lift_kernels {shape}", call


@contextlib.contextmanager
def _index_type(index: str):
    """Launch the 'long long' instantiations for every problem, as the emulator tests do."""
    previous = _kernels.INT32_MAX
    _kernels.INT32_MAX = -1 if index == "long long" else previous
    try:
        yield
    finally:
        _kernels.INT32_MAX = previous


def record(calls, dtypes, indices=("int",)) -> dict[Launch, str]:
    """{launch: the first problem that made it ("benchmark dw-256-56 float16")} of calls (label, call) in
    every dtype of `dtypes` (float32 also with TF32 allowed) and index type."""
    device = RecordingDevice()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_device.use_device(device))
        stack.enter_context(settings.autotune(False))
        stack.enter_context(numpy.errstate(all="ignore"))  # NumPy-side arithmetic on uninitialised arrays
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", RuntimeWarning)
        for label, call in calls:
            for dtype_name, index in itertools.product(dtypes, indices):
                for tf32 in (False, True) if dtype_name == "float32" else (False,):
                    device.case = f"{label} {dtype_name}{' TF32' if tf32 else ''}{' 64-bit' if index != 'int' else ''}"
                    with settings.allow_tf32(tf32), _index_type(index):
                        call(device, DTYPES[dtype_name])
    return device.launches


# Kernels instantiated for 32-bit indices only, whose planners refuse a problem that needs 64 (the old path runs it
# instead, and its own launches are recorded): patch_fwd_igemm and patch_bwd_weight_igemm (ops/implicit_gemm.py
# `patch_igemm_refusal`, `patch_weight_refusal`) and conv_fwd_wgmma (ops/wgmma_gemm.py `wgmma_refusal`:
# conv_fwd_igemm takes those).
INT_ONLY = ("patch_fwd_igemm<", "patch_bwd_weight_igemm<", "conv_fwd_wgmma<")


def index_twin(launch: Launch) -> Launch | None:
    """The same launch of the 'long long' instantiation: kernel<T, int, ...> -> kernel<T, long long, ...>; but
    channels_last_copies, instantiated for int only: with 64-bit indices each of its copies runs alone on
    channels_last_copy's whole-vector instantiation (`_channels_last_copies`), the one plan that the index type
    changes; None for the INT_ONLY kernels (no twin)."""
    if launch.name.startswith(INT_ONLY):
        return None
    copies = re.fullmatch(r"channels_last_copies<([^,<>]+), int, (?:true|false)>", launch.name)
    if copies:
        return Launch(launch.source, f"channels_last_copy<{copies[1]}, long long, true>", launch.block,
                      launch.shared_mem)
    name = re.sub(r"^(\w+<[^,<>]+, )int\b", r"\1long long", launch.name)
    assert name != launch.name, launch.name
    return Launch(launch.source, name, launch.block, launch.shared_mem)


@functools.lru_cache(maxsize=None)
def recorded_launches() -> dict[Launch, str]:
    """Every distinct launch of the emulator tests' cases in every dtype and of the GPU benchmark cases in
    float16, bfloat16 and float32 (benchmarks/cases.py has no float64), with 32-bit indices, and the same launches
    of the 'long long' instantiations (`index_twin`: nothing a planner decides depends on the index type but
    whether copies share a launch, which test_64bit_indices_change_no_plan checks; recording them would double this
    function's few seconds)."""
    launches = {**record(benchmark_calls(), ("float16", "bfloat16", "float32")),
                **record(emulator_test_calls(), DTYPES)}
    twins = {index_twin(launch): f"{case} 64-bit" for launch, case in launches.items()}
    return {**launches, **{twin: case for twin, case in twins.items() if twin is not None}}


# ---------------------------------------------------------------------------------------------------------
# The check


def launch_problems(launch: Launch, usage: Usage, arch: str) -> list[str]:
    """Why `launch` of a kernel with resources `usage` cannot run on arch (nothing: it can)."""
    problems = []
    warps = -(-launch.threads // 32)
    registers = warps * 32 * -(-usage.registers // REGISTER_UNIT_PER_THREAD) * REGISTER_UNIT_PER_THREAD
    if launch.threads > MAX_THREADS:
        problems.append(f"{launch.threads} threads, more than {MAX_THREADS}")
    if usage.registers > MAX_REGISTERS_PER_THREAD or registers > REGISTERS_PER_BLOCK:
        problems.append(f"{usage.registers} registers x {launch.threads} threads = {registers} allocated, more "
                        f"than {REGISTERS_PER_BLOCK}")
    total = usage.shared + launch.shared_mem
    opted_in = launch.shared_mem > SHARED_WITHOUT_OPT_IN
    limit = SHARED_OPT_IN[arch] if opted_in else SHARED_WITHOUT_OPT_IN
    if usage.shared > SHARED_WITHOUT_OPT_IN or total > limit:
        problems.append(f"shared memory {usage.shared} static + {launch.shared_mem} dynamic = {total} bytes, more "
                        f"than {limit}" + (" (the opt-in limit)" if opted_in else " (without opting in)"))
    return problems


def spill_problems(usage: dict[str, Usage]) -> list[str]:
    """Kernels of the spill-free element types that use local memory.  ptxas puts register spills (and local
    arrays it cannot keep in registers) in the stack frame: cuobjdump's STACK, not its LOCAL, shows them."""
    return [f"{name}: {u.stack} bytes of stack frame (spills), {u.local} bytes of local memory, {u.registers} "
            f"registers" for name, u in sorted(usage.items())
            if element_type(name) in SPILL_FREE_TYPES and (u.local or u.stack)]


@functools.lru_cache(maxsize=None)
def _usage(filename: str, arch: str, programs) -> dict[str, Usage]:
    program = programs(filename, arch)
    assert program.ok and program.cubin, f"NVRTC could not compile {filename} for {arch}: tests/test_nvrtc.py says why"
    return resource_usage(program, arch)


@functools.lru_cache(maxsize=None)
def opcodes_of(filename: str, arch: str, programs) -> dict[str, Counter]:
    """{name expression: Counter of SASS mnemonics} of every instantiation of a kernel file (`sass_opcodes`);
    programs: the `kernel_programs` fixture."""
    program = programs(filename, arch)
    assert program.ok and program.cubin, f"NVRTC could not compile {filename} for {arch}: tests/test_nvrtc.py says why"
    return sass_opcodes(program)


def test_recorded_launches_are_listed_instantiations():
    launches = recorded_launches()
    listed = set(_device.all_instantiations())
    unlisted = sorted({(la.source, la.name) for la in launches} - listed)
    assert not unlisted, f"launched but missing from instantiations(): {unlisted}"
    # (timing.cu's spin is launched by autotuning on a GPU, CudaDevice.timed, never by an op's plan)
    assert {la.source for la in launches} == set(GROUPS) - {"timing.cu"}, "every op's kernel file has a launch"


def test_64bit_indices_change_no_plan():
    """What recorded_launches assumes: with 64-bit indices the emulator cases launch the same blocks and shared
    memory (of the 'long long' instantiations).  float32 only, to keep it quick."""
    narrow = record(emulator_test_calls(), ("float32",))
    wide = record(emulator_test_calls(), ("float32",), ("long long",))
    assert set(wide) == {index_twin(launch) for launch in narrow}


def register_bound(optimised: dict[str, Usage], name: str) -> int:
    """The registers assumed for an instantiation without optimised SASS: the most of the optimised instantiations of
    its kernel template, element type and variant (test_nvrtc.variant), of either index type: its representative,
    the largest size, where registers peak (test_nvrtc.sass_names says why), and on sm_90 its own 32-bit twin."""
    return max(u.registers for n, u in optimised.items() if variant(n) == variant(name))


@pytest.mark.slow
@pytest.mark.parametrize("filename, arch", program_params(SASS_ARCHES))
def test_resources_fit_every_planned_launch(filename, arch, kernel_programs, sass_tools):
    usage = _usage(filename, arch, kernel_programs)
    missing = sorted(set(sass_names(filename, arch)) - set(usage))
    assert not missing, f"cuobjdump -res-usage lists no resources for {missing}"
    problems = spill_problems(usage)
    if fast_names(filename, arch):
        # The launches of the instantiations outside the optimised program (test_nvrtc.fast_names: sm_80's outside
        # its representatives, sm_90's 64-bit twins outside theirs) still meet the limits: their static shared memory
        # read from the fast program (the same declared __shared__ arrays: checked equal on sm_80's representatives,
        # compiled both ways), their registers, barely optimised there, bounded by `register_bound`.
        whole = resource_usage(kernel_programs(filename, arch, sass=False), arch)
        differ = {n: (whole[n].shared, u.shared) for n, u in usage.items()
                  if n in whole and whole[n].shared != u.shared}
        assert not differ, f"static shared memory (fast compile, optimised) differs: {differ}"
        usage = {**{n: Usage(register_bound(usage, n), 0, u.shared, 0) for n, u in whole.items()}, **usage}
    for launch, case in sorted(recorded_launches().items(), key=lambda item: (item[0].name, item[0].block)):
        if launch.source == filename and launch.name in usage:   # (sm_80 has no 64-bit-index twins compiled)
            problems += [f"{launch.name}, block {launch.block}, {launch.shared_mem} bytes of dynamic shared memory "
                         f"({case}): {p}" for p in launch_problems(launch, usage[launch.name], arch)]
    assert not problems, f"{filename} on {arch}:\n" + "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [pytest.param(a, marks=on_program("implicit_gemm.cu", a)) for a in SASS_ARCHES])
def test_tensor_core_kernels_contain_matrix_instructions(arch, kernel_programs, sass_tools):
    """The three tensor-core passes run on the tensor cores: HMMA in every instantiation, every tile (16 per K
    chunk of 32 in a warp's 32 x 32 tile for 16-bit inputs, 32 for TF32's k8 steps), and no other kernel pretends
    to (no FMA-only fallback hidden behind the name)."""
    from cupyconv.ops import implicit_gemm
    opcodes = opcodes_of("implicit_gemm.cu", arch, kernel_programs)
    listed = sass_names("implicit_gemm.cu", arch)
    # sm_90: every instantiation with 32-bit indices (`narrow`, counted here), and each pass, type and variant at its
    # largest tile with 64-bit ones, as sm_80 with 32-bit ones (test_nvrtc.sass_names)
    complete = arch in FULL_ARCHES

    def narrow(names: list[str]) -> list[str]:
        return [n for n in names if index_type(n) == "int"]
    names = [n for n in listed if n.split("<")[0] in implicit_gemm.TC_PASSES.values()]
    tiles = sum(len(tiles) for tiles in implicit_gemm.TC_TILES.values())
    assert not complete or len(narrow(names)) == len(implicit_gemm.TC_PASSES) * tiles
    for name in names:
        expected = 32 if "<float," in name else 16
        assert opcodes[name]["HMMA"] == expected, (name, opcodes[name]["HMMA"])
    weight_igemm = [n for n in listed if n.startswith("conv_bwd_weight_igemm<")]
    assert not complete or len(narrow(weight_igemm)) == sum(map(len, implicit_gemm.WG_TILES.values()))
    for name in weight_igemm:  # + the bias gradient's: A times a column of ones (TF32: twice, A and its remainder)
        expected = 24 if "<float," in name else 40 if ", 128, " in name else 20
        assert opcodes[name]["HMMA"] == expected, (name, opcodes[name]["HMMA"])
    channels_last = [n for n in listed
                     if n.startswith(("conv_fwd_igemm<", "conv_fwd_igemm_phases<", "conv_fwd_igemm_3d<"))]
    for name in channels_last:   # a (BM / 2) x (BN / 2) warp tile: BM * BN / 512 mma tiles, two k-steps per chunk
        rows, columns, stages = (int(part) for part in name.rstrip(">").split(",")[2:5])
        # ig_forward's PAIRS (conv_fwd_igemm's tiles of up to 128 rows, of 256 with 32-bit indices; an even number
        # of stages): two chunks a trip
        pairs = 2 if (name.startswith("conv_fwd_igemm<") and (rows <= 128 or ", int," in name)
                      and stages % 2 == 0) else 1
        assert opcodes[name]["HMMA"] == pairs * rows * columns // 256, (name, opcodes[name]["HMMA"])
    several_groups = [n for n in listed if n.startswith("conv_fwd_igemm_groups<")]
    forward_channels = implicit_gemm.IGG_FORWARD_CHANNELS.values()
    assert not complete or len(narrow(several_groups)) == sum(map(len, forward_channels))
    for name in several_groups:   # per chunk, every warp: its rows x its groups' columns, a k-step per 32 bytes of K
        rows, channels = (int(part) for part in name.rstrip(">").split(",")[2:4])
        itemsize = 4 if "<float," in name else 2
        # a block's groups (4 warps: 4 / groups a group, splitting its rows; 8 groups: two a warp), and its chunk's
        # taps (two for a group of one 16-byte vector)
        groups, chunk_taps = 128 // itemsize // channels, 2 if channels * itemsize == 16 else 1
        warp_rows, warp_groups = rows // max(1, 4 // groups), max(1, groups // 4)
        expected = warp_rows // 16 * warp_groups * (channels // 8) * (chunk_taps * channels * itemsize // 32)
        assert opcodes[name]["HMMA"] == expected, (name, opcodes[name]["HMMA"])
    weight_groups = [n for n in listed if n.startswith("conv_bwd_weight_igemm_groups<")]
    assert not complete or len(narrow(weight_groups)) == sum(map(len, implicit_gemm.IGG_GROUP_CHANNELS.values()))
    for name in weight_groups:   # two k-steps a chunk, each warp: its taps x CG x CG, + A x ones (TF32: twice)
        channels, tf32 = int(name.rstrip(">").split(",")[2]), "<float," in name
        groups = (32 if tf32 else 64) // channels   # a block's (4 warps: 4 / groups a group, splitting its taps)
        gemm = implicit_gemm.WGG_TAPS // (4 // groups) * (channels // 16) * (channels // 8)
        expected = 2 * (gemm + channels // 16 * (2 if tf32 else 1))
        assert opcodes[name]["HMMA"] == expected, (name, opcodes[name]["HMMA"])
    whole_patches = [n for n in listed if n.startswith("patch_fwd_igemm<")]
    assert not complete or len(whole_patches) == len(implicit_gemm.PT_DTYPES)
    for name in whole_patches:   # a main-loop trip, each warp: one tap x PT_STEP channels of its 64 x 32 tile
        assert opcodes[name]["HMMA"] == 64 // 16 * (32 // 8) * (implicit_gemm.PT_STEP // 16), (name, opcodes[name])
    weight_patches = [n for n in listed if n.startswith("patch_bwd_weight_igemm<")]
    assert not complete or len(weight_patches) == len(implicit_gemm.PT_DTYPES)
    for name in weight_patches:   # a trip of 4 K steps of 16 pixels, each warp: 2 d tiles x all units' 2 n tiles,
        assert opcodes[name]["HMMA"] == 4 * (2 * 2 * implicit_gemm.PW_UNITS + 2), (name, opcodes[name])   # + A x ones
    names += weight_igemm + channels_last + several_groups + weight_groups + whole_patches + weight_patches
    assert not [n for n in listed if n not in names and opcodes[n]["HMMA"]]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [pytest.param(a, marks=on_program("conv.cu", a)) for a in SASS_ARCHES])
def test_conv_kernels_contain_no_matrix_instructions(arch, kernel_programs, sass_tools):
    """conv.cu's kernels are the FMA paths: no tensor-core kernel hides there (its own test, in conv.cu's group)."""
    conv_opcodes = opcodes_of("conv.cu", arch, kernel_programs)
    assert not [n for n in sass_names("conv.cu", arch) if conv_opcodes[n]["HMMA"]]


# The most instructions one warp may issue per HMMA in a tensor-core main loop (sm_90, 32-bit index, by pass and
# tile; TF32 runs twice the HMMA for the same chunk).  The loop is the kernels' bottleneck (benchmarks/RESULTS.md):
# the gathers decode each column k once per chunk and each row once per kernel, and an edit that moves that work
# back into every element (the kernels before that issued 40-235 per HMMA) fails here.  About 15% above the counts
# of NVRTC 13.0's code for the kernels of 2026-11-23's fifth session.
LOOP_INSTRUCTIONS_PER_HMMA = {
    ("conv_fwd_tc", 64, 64): 40, ("conv_fwd_tc", 128, 64): 30, ("conv_fwd_tc", 64, 32): 60,
    ("conv_bwd_input_tc", 64, 64): 60, ("conv_bwd_input_tc", 128, 64): 49, ("conv_bwd_input_tc", 64, 32): 102,
    ("conv_bwd_weight_tc", 64, 64): 40, ("conv_bwd_weight_tc", 128, 64): 37, ("conv_bwd_weight_tc", 64, 32): 57,
}


def tensor_core_loop_table(program) -> list[tuple[str, int, Counter]]:
    """(name, instructions, opcodes) of each compiled tensor-core instantiation's main loop, in GROUPS order."""
    from cupyconv.ops import implicit_gemm
    loops = main_loop_opcodes(program)
    return [(name, sum(loops[name].values()), loops[name]) for name in sass_names("implicit_gemm.cu", "sm_90")
            if name.split("<")[0] in implicit_gemm.TC_PASSES.values() and name in program.lowered]


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_tensor_core_main_loops_stay_lean(kernel_programs, sass_tools):
    """Each tensor-core main loop issues at most LOOP_INSTRUCTIONS_PER_HMMA instructions per HMMA (sm_90, int)."""
    problems = []
    for name, instructions, opcodes in tensor_core_loop_table(kernel_programs("implicit_gemm.cu", "sm_90")):
        kernel, rest = name.split("<")
        _, index, rows, columns = (part.strip() for part in rest.rstrip(">").split(","))
        if index == "int":
            per_hmma = instructions / opcodes["HMMA"]
            if per_hmma > LOOP_INSTRUCTIONS_PER_HMMA[kernel, int(rows), int(columns)]:
                problems.append(f"{name}: {instructions} instructions per chunk, {per_hmma:.1f} per HMMA")
    assert not problems, "\n".join(problems)


LDS_SLACK = 2
# The most instructions a simt_gemm.cu main loop issues per FFMA (sm_90, int), by kernel and tile: about 4% above
# NVRTC 13.0's code of 2026-11-26 for simt_fwd, whose gather keeps per-pixel window masks and a tap table (one AND
# per element, no bounds arithmetic or decoding in the loop) and copies each element by a 4-byte cp.async (no
# staging register, store or zeroing) in K chunks of 16 for 256 x 64 and 128 x 32 (task simtcp): 128 x 64 1.32,
# 256 x 64 1.18, 192 x 64 x 12 1.21 (task simtfwd), 128 x 32 1.40, 256 x 32 1.32, 128 x 128 1.19, 256 x 128 1.16
# (register-staged in chunks of 8: 1.34, 1.23, 1.50, 1.36, 1.20, 1.17; with per-element compares before that
# 1.40, 1.29, 1.62, 1.49, 1.23, 1.19); B by unpredicated 16-byte copies of a zero-padded weight_t since
# 2026-11-27 (task simt32, twenty-fifth session): 1.31, 1.17, 1.20, 1.38, 1.29, 1.17, 1.15, the limits moved with it;
# about 6% above that of 2026-11-25 for simt_bwd_weight (128 x 64 1.52, 96 x 64 1.46, 128 x 32 1.67, 64 x 32 1.75,
# 128 x 128 1.32, with the bias gradient as column sums of the staged grad_out, not a row of ones selected per
# element of A; 192 x 64 x 12 1.38 of 2026-11-27 at 168 registers, task simtdw).
# The 32-column tiles pay more per FFMA (each gathered element of A feeds 32 FMAs, not 64) but none on padding
# columns.
FMA_LOOP_INSTRUCTIONS_PER_FFMA = {
    ("simt_fwd", 128, 64): 1.36, ("simt_fwd", 256, 64): 1.22, ("simt_fwd", 128, 32): 1.44,
    ("simt_fwd", 256, 32): 1.35, ("simt_fwd", 192, 64): 1.25,
    ("simt_fwd", 128, 128): 1.21, ("simt_fwd", 256, 128): 1.19,
    ("simt_bwd_weight", 128, 64): 1.61, ("simt_bwd_weight", 96, 64): 1.55, ("simt_bwd_weight", 128, 32): 1.77,
    ("simt_bwd_weight", 64, 32): 1.86, ("simt_bwd_weight", 128, 128): 1.4, ("simt_bwd_weight", 192, 64): 1.44,
}


def never_executed_loads(instructions: list[dict]) -> int:
    """The `@!PT LDS RZ, [RZ]` of a kernel's main loop: placeholders ptxas puts before LDGSTS, predicated off."""
    begin, end = sass.main_loop_span(instructions)[1]
    return sum(i["opcode"] == "LDS" and i.get("predicate") == "@!PT" for i in instructions[begin:end + 1])


@pytest.mark.slow
@on_program("simt_gemm.cu", "sm_90")
def test_fma_gemm_main_loops_are_fma_bound(kernel_programs, sass_tools):
    """simt_gemm.cu's kernels stay strict float32 on the FMA units: no HMMA anywhere; per K chunk a thread's
    main loop issues TM x 8 x chunk FFMA and (TM / 4 + 2) x chunk shared loads (chunk: SIMT_CHUNK, simt_fwd's
    `simt_fwd_chunk` on sm_80+; float4: one per 4 values of A or B; simt_fwd
    also one LDS.64 of its tap table per k slot; ptxas's never-executed `@!PT LDS` placeholders beside simt_fwd's
    LDGSTS are not loads and are not counted as such), and at
    most FMA_LOOP_INSTRUCTIONS_PER_FFMA instructions per FFMA (sm_90, int): an edit that moves a division, a branch
    or a scalar load into the loop, or lets a TF32 path in, fails here.  LDS_SLACK extra shared loads pass: at TM = 16 (128 accumulators) ptxas
    may reload one value from shared memory rather than keep it in a register; CI's fresh environment compiled
    simt_fwd<float, int, 256, 64, 16> with 49 LDS where this machine, on the same NVRTC release, got 48.  Scalar
    loads would add 3 per float4 (over 100), far beyond the slack."""
    from cupyconv.ops import simt_gemm
    program = kernel_programs("simt_gemm.cu", "sm_90")
    opcodes, code = opcodes_of("simt_gemm.cu", "sm_90", kernel_programs), sass.disassemble(program)
    assert not [n for n in sass_names("simt_gemm.cu", "sm_90") if opcodes[n]["HMMA"]]
    problems = []
    for name in sass_names("simt_gemm.cu", "sm_90"):
        bm, bn, tm = (int(part) for part in name.rstrip(">").split(",")[-3:])
        rule, loop = sass.main_loop(code[name])
        assert rule == "fma", (name, rule)
        ffma, lds, total = loop["FFMA"], loop["LDS"] - never_executed_loads(code[name]), sum(loop.values())
        chunk = simt_gemm.simt_fwd_chunk((bm, bn, tm)) if name.startswith("simt_fwd") else simt_gemm.SIMT_CHUNK
        float4_loads = (tm // 4 + 2) * chunk
        if name.startswith("simt_fwd"):   # and one read of the tap table per k slot of A a thread loads
            float4_loads += chunk // (bm * bn // (8 * tm) // 32)
        most = FMA_LOOP_INSTRUCTIONS_PER_FFMA[name.split("<")[0], bm, bn]
        if "<float, int," in name and (ffma != tm * 8 * chunk
                                       or not float4_loads <= lds <= float4_loads + LDS_SLACK or total > most * ffma):
            problems.append(f"{name}: {ffma} FFMA, {lds} LDS of {total} loop instructions ({total / ffma:.2f} a FFMA)")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@on_program("simt_gemm.cu", "sm_90")
def test_fma_gemm_tall_tiles_blocks_an_sm(kernel_programs, sass_tools):
    """simt_fwd_tile weighs the forward's tiles by the busiest SM's work (`simt_sm_work`), which counts each tile's
    SIMT_BLOCKS_AN_SM resident blocks: each must be the tile's occupancy on sm_90 (int), so that a tile whose
    registers change its occupancy fails here, not silently in the plans (and so must the weight gradient's
    192 x 64 x 12, SIMT_FIT_WEIGHT_BLOCKS)."""
    from cupyconv.ops import simt_gemm
    usage = resource_usage(kernel_programs("simt_gemm.cu", "sm_90"), "sm_90")
    problems = []
    for tile, want in simt_gemm.SIMT_BLOCKS_AN_SM.items():
        name = f"simt_fwd<float, int, {tile[0]}, {tile[1]}, {tile[2]}>"
        threads = tile[0] * tile[1] // (8 * tile[2])
        blocks = sass.occupancy(usage[name].registers, threads, usage[name].shared).blocks_per_sm
        if blocks != want:
            problems.append(f"{name}: {blocks} blocks an SM, the planner counts {want}")
    # the weight gradient's 192 x 64 x 12, whose plans split for SIMT_FIT_WEIGHT_BLOCKS an SM (12 warps)
    name = "simt_bwd_weight<float, int, 192, 64, 12>"
    blocks = sass.occupancy(usage[name].registers, 128, usage[name].shared).blocks_per_sm
    if blocks != simt_gemm.SIMT_FIT_WEIGHT_BLOCKS:
        problems.append(f"{name}: {blocks} blocks an SM, the planner counts {simt_gemm.SIMT_FIT_WEIGHT_BLOCKS}")
    # and its loop costs: the ratios of the tiles' main-loop instructions a FFMA, within 2%
    code = sass.disassemble(kernel_programs("simt_gemm.cu", "sm_90"))

    def per_ffma(tile):
        loop = sass.main_loop(code[f"simt_fwd<float, int, {tile[0]}, {tile[1]}, {tile[2]}>"])[1]
        return sum(loop.values()) / loop["FFMA"]
    for cost, tile, other in (("SIMT_TALL_FIT_COST", simt_gemm.SIMT_TALL_FIT, simt_gemm.SIMT_TALL),
                              ("SIMT_NARROW_FIT_COST", simt_gemm.SIMT_NARROW, simt_gemm.SIMT_TALL_NARROW),
                              ("SIMT_SPLIT_COST", simt_gemm.SIMT_NARROW, simt_gemm.SIMT_TILE)):
        ratio = per_ffma(tile) / per_ffma(other)
        if abs(ratio - getattr(simt_gemm, cost)) > 0.02:
            problems.append(f"{cost} {getattr(simt_gemm, cost)}: {tile} issues {ratio:.3f}x {other}'s a FFMA")
    assert not problems, "\n".join(problems)


# conv_bwd_weight_igemm's main loop (sm_90, int): the most instructions a warp issues per HMMA of the GEMM (the
# bias gradient's HMMA, a fifth of the loop's, a third for TF32, counted as instructions), by tile.  NVRTC 13.0
# on 2026-11-25: 128 x 128 5.5, 128 x 64 5.9, 64 x 64 9.0, 32 x 64 12.4 for 16-bit; TF32 13.6 and 17.1 (its
# fragments are read per word, no ldmatrix for 32-bit elements; rounded once by the channels-last copies, no
# longer at every fragment read, which took it from 21.0 and 24.6).  The issue-24 target is 6 for the large tiles.
# 2026-11-27 (task wdense): 128 x 128 6.25 at its 128 registers (two blocks an SM, `__launch_bounds__`: NVRTC
# recomputes a few fragment offsets a chunk), 128 x 64 5.8, 64 x 64 8.9, TF32 64 x 64 13.4.
WEIGHT_IGEMM_INSTRUCTIONS_PER_HMMA = {(128, 128): 6.5, (128, 64): 6.5, (64, 64): 9.5, (32, 64): 13.0}
WEIGHT_IGEMM_TF32_INSTRUCTIONS_PER_HMMA = {(64, 64): 14.5, (32, 64): 18.0}


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_weight_igemm_main_loop_is_lean(kernel_programs, sass_tools):
    """conv_bwd_weight_igemm's main loop: 16-byte cp.async (LDGSTS) and ldmatrix (LDSM, 16-bit) present, no
    local memory, at most WEIGHT_IGEMM_*_INSTRUCTIONS_PER_HMMA instructions per GEMM HMMA (sm_90, int)."""
    program = kernel_programs("implicit_gemm.cu", "sm_90")
    loops, usage = main_loop_opcodes(program), resource_usage(program, "sm_90")
    problems = []
    for name in sass_names("implicit_gemm.cu", "sm_90"):
        if not name.startswith("conv_bwd_weight_igemm<"):
            continue
        ops, tf32 = loops[name], "<float," in name
        if usage[name].local:
            problems.append(f"{name}: {usage[name].local} bytes of local memory")
        if not ops["LDGSTS"] or (not tf32 and not ops["LDSM"]):
            problems.append(f"{name}: no LDGSTS / LDSM in the main loop: {dict(ops)}")
        if ", int, " in name:
            rows, columns = (int(part) for part in name.rstrip(">").split(",")[2:])
            gemm = ops["HMMA"] * 2 // 3 if tf32 else ops["HMMA"] * 4 // 5
            per_hmma = sum(ops.values()) / gemm
            table = WEIGHT_IGEMM_TF32_INSTRUCTIONS_PER_HMMA if tf32 else WEIGHT_IGEMM_INSTRUCTIONS_PER_HMMA
            if per_hmma > table[rows, columns]:
                problems.append(f"{name}: {sum(ops.values())} instructions per chunk, {per_hmma:.2f} per GEMM HMMA")
    assert not problems, "\n".join(problems)


# The most instructions one warp may issue per HMMA in the channels-last forward's main loop (sm_90, 32-bit
# index, 16-bit types; the input gradient at stride 1 is the same kernel), by tile: issue 24's target of 6 for
# the large tiles, which the planner takes wherever the grid fills two waves.  NVRTC 13.0 on 2026-11-25, the
# ldmatrix offsets kept in registers (`ig_keep_in_register`): 3.4 (128 x 128), 3.7 (256 x 64), 5.2 (128 x 64), 8.3
# (64 x 64: its per-chunk address and mask upkeep is shared by only 16 HMMA); the narrow tiles of groups of at most
# 32 columns (IG_NARROW_TILES) 5.9 (256 x 32) and 9.0 (128 x 32: 16 HMMA a chunk), where a 64-column tile would
# spend half or more of its HMMA on padding.  About 8% above those: with the offsets recomputed from threadIdx in
# every trip, as NVRTC does on its own, the four larger tiles fail (3.8, 4.1, 5.9, 6.8).
IGEMM_LOOP_PER_HMMA = {(128, 128): 3.7, (256, 64): 4.0, (128, 64): 5.6, (64, 64): 9.0, (256, 32): 6.4,
                       (128, 32): 9.7}


def channels_last_loop_problems(kernels: tuple, bounds: dict, programs) -> tuple[int, list[str]]:
    """(how many, what is wrong with them) of the 16-bit, 32-bit-index instantiations of `kernels` (implicit_gemm.cu,
    sm_90): their main loop above bounds[tile] instructions per HMMA, or operands not by cp.async (LDGSTS) and
    ldmatrix (LDSM) only -- a global load (LDG), or a shared load (LDS) beyond the three `LDS RZ, [RZ]` that NVRTC
    places before a chunk's LDGSTS (ordering fences that load nothing)."""
    loops = main_loop_opcodes(programs("implicit_gemm.cu", "sm_90"))
    problems, seen = [], 0
    for name in sass_names("implicit_gemm.cu", "sm_90"):
        kernel, dtype = name.split(",")[0].split("<")
        if kernel not in kernels or ", int," not in name or dtype == "float":
            continue
        seen += 1
        loop = loops[name]
        tile = tuple(int(part) for part in name.rstrip(">").split(",")[2:4])
        per_hmma = sum(loop.values()) / loop["HMMA"]
        if per_hmma > bounds[tile]:
            problems.append(f"{name}: {per_hmma:.1f} instructions per HMMA")
        if not loop["LDGSTS"] or not loop["LDSM"] or loop["LDG"] or loop["LDS"] > 3:
            problems.append(f"{name}: LDGSTS {loop['LDGSTS']}, LDSM {loop['LDSM']}, LDG {loop['LDG']}, "
                            f"LDS {loop['LDS']}")
    return seen, problems


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_channels_last_main_loop_is_lean(kernel_programs, sass_tools):
    """conv_fwd_igemm's main loop (and conv_fwd_igemm_phases', the same body): at most IGEMM_LOOP_PER_HMMA
    instructions per HMMA, its operands by cp.async and ldmatrix only (`channels_last_loop_problems`)."""
    seen, problems = channels_last_loop_problems(("conv_fwd_igemm", "conv_fwd_igemm_phases"), IGEMM_LOOP_PER_HMMA,
                                                 kernel_programs)
    assert seen == 24 and not problems, "\n".join(problems)


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_channels_last_tiles_blocks_an_sm(kernel_programs, sass_tools):
    """The planner's `IG_BLOCKS_AN_SM` (each 2-D conv_fwd_igemm tile's resident blocks an SM, from which
    `wave_splits` sizes a split grid's wave) is what the compiled registers and the tile's shared memory give on
    sm_90 with 32-bit indices, for every dtype: a tile whose registers change its occupancy fails here, not
    silently in the plans.  (The 64-bit instantiations hold a block fewer of 64 x 64 and float's 128 x 64; a problem
    that needs them is planned with the same table, a split grid under a wave being rare at 2^31 elements.)"""
    from cupyconv.ops import implicit_gemm
    usage = resource_usage(kernel_programs("implicit_gemm.cu", "sm_90"), "sm_90")
    items = {"__half": 2, "__nv_bfloat16": 2, "float": 4}
    problems, seen = [], 0
    for name in sass_names("implicit_gemm.cu", "sm_90"):
        if not name.startswith("conv_fwd_igemm<") or ", int," not in name:
            continue
        seen += 1
        args = template_args(name)
        tile = tuple(int(a) for a in args[2:5])
        blocks = sass.occupancy(usage[name].registers, implicit_gemm.IG_THREADS,
                                implicit_gemm.ig_shared_bytes(tile, items[args[0]])).blocks_per_sm
        if blocks != implicit_gemm.IG_BLOCKS_AN_SM[tile]:
            problems.append(f"{name}: {blocks} blocks an SM, the planner says {implicit_gemm.IG_BLOCKS_AN_SM[tile]}")
    assert seen == 16 and not problems, "\n".join(problems)


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_weight_igemm_tiles_blocks_an_sm(kernel_programs, sass_tools):
    """The weight planner's `WG_BLOCKS_AN_SM` (each conv_bwd_weight_igemm tile's resident blocks an SM, the wave
    `plan_weight_igemm` splits for) is what the compiled registers and static shared memory give on sm_90 with
    32-bit indices, for every dtype; and the 128 x 128 tile keeps to 128 registers without spilling (its
    `__launch_bounds__`: two blocks an SM)."""
    from cupyconv.ops import implicit_gemm
    usage = resource_usage(kernel_programs("implicit_gemm.cu", "sm_90"), "sm_90")
    kinds = {"__half": "16-bit", "__nv_bfloat16": "16-bit", "float": "tf32"}
    problems, seen = [], 0
    for name in sass_names("implicit_gemm.cu", "sm_90"):
        if not name.startswith("conv_bwd_weight_igemm<") or ", int," not in name:
            continue
        seen += 1
        args = template_args(name)
        tile = (int(args[2]), int(args[3]))
        use = usage[name]
        blocks = sass.occupancy(use.registers, implicit_gemm.weight_igemm_threads(tile), use.shared).blocks_per_sm
        if blocks != implicit_gemm.WG_BLOCKS_AN_SM[kinds[args[0]], tile] or use.local:
            problems.append(f"{name}: {blocks} blocks an SM ({use.registers} registers, {use.local} bytes of local "
                            f"memory), the planner says {implicit_gemm.WG_BLOCKS_AN_SM[kinds[args[0]], tile]}")
    assert seen == sum(map(len, implicit_gemm.WG_TILES.values())) and not problems, "\n".join(problems)


# conv_fwd_igemm_3d (ig_forward's DEPTH), by tile: its main loop per HMMA, NVRTC 13.0 of 2026-11-26: 4.3 (256 x 64),
# 6.3 (128 x 64), 9.3 (64 x 64), 10.3 (128 x 32); the 2-D tiles' plus the carry into the depth tap (its branch lies
# in the loop: executed once per kernel_h * kernel_w taps) and a bit test a row.  About 8% above those.
IGEMM_3D_LOOP_PER_HMMA = {(256, 64): 4.7, (128, 64): 6.8, (64, 64): 10.0, (128, 32): 11.1}


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_3d_main_loop_is_lean(kernel_programs, sass_tools):
    """conv_fwd_igemm_3d's main loop (16-bit): at most IGEMM_3D_LOOP_PER_HMMA instructions per HMMA, operands by
    cp.async and ldmatrix only, as conv_fwd_igemm's."""
    from cupyconv.ops import implicit_gemm
    seen, problems = channels_last_loop_problems(("conv_fwd_igemm_3d",), IGEMM_3D_LOOP_PER_HMMA, kernel_programs)
    expected = sum(len(implicit_gemm.IG_3D_TILES[t] + implicit_gemm.IG_3D_NARROW) for t in ("float16", "bfloat16"))
    assert seen == expected and not problems, "\n".join(problems)


# conv_fwd_igemm_groups (several small groups a block), by channels per group: its main loop per tap, NVRTC 13.0 of
# 2026-11-26: 9.0 instructions per HMMA for 16-bit groups of 16 (16 HMMA a tap per warp, against 9.0 for
# conv_fwd_igemm's 128 x 32 tile, half of whose HMMA are padding there; TF32's 9.25), 5.4 for 32.  About 5-10% above
# those.  Groups of 8 (task grptc, NVRTC 13.0, 2026-11-27): 15.3 a chunk of two taps (16 HMMA a warp: its two
# groups' rows; 17 LDGSTS with their bounds tests, 17 LDSM), against 8.75 and 5.34 for 16 and 32 then.
IGEMM_GROUPS_LOOP_PER_HMMA = {8: 16.1, 16: 9.7, 32: 6.0}


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_several_groups_main_loop_is_lean(kernel_programs, sass_tools):
    """conv_fwd_igemm_groups' main loop: at most IGEMM_GROUPS_LOOP_PER_HMMA instructions per HMMA, operands by
    LDGSTS and LDSM only (no LDG; the LDS are NVRTC's three `LDS RZ, [RZ]` fences a staged tap)."""
    loops = main_loop_opcodes(kernel_programs("implicit_gemm.cu", "sm_90"))
    problems, seen = [], 0
    for name in sass_names("implicit_gemm.cu", "sm_90"):
        if not name.startswith("conv_fwd_igemm_groups<") or ", int," not in name:
            continue
        seen += 1
        loop = loops[name]
        channels = int(name.rstrip(">").split(",")[3])
        per_hmma = sum(loop.values()) / loop["HMMA"]
        if per_hmma > IGEMM_GROUPS_LOOP_PER_HMMA[channels]:
            problems.append(f"{name}: {per_hmma:.1f} instructions per HMMA")
        fences = 6 if channels == 8 else 3   # (three a tap staged: a chunk of 8 channels a group is two taps)
        if not loop["LDGSTS"] or not loop["LDSM"] or loop["LDG"] or loop["LDS"] > fences:
            problems.append(f"{name}: LDGSTS {loop['LDGSTS']}, LDSM {loop['LDSM']}, LDG {loop['LDG']}, "
                            f"LDS {loop['LDS']}")
    assert seen == 7 and not problems, "\n".join(problems)


# conv_bwd_weight_igemm_groups (the weight gradient of several small groups a block), by (element type, channels per
# group): its main loop per chunk, instructions per GEMM HMMA (the bias's HMMA counted as instructions).  NVRTC 13.0
# of 2026-11-26: 22.9 for 16-bit groups of 16 (8 GEMM HMMA a chunk per warp against 6 cp.async a thread: the copies'
# addresses and bounds dominate; conv_bwd_weight_igemm's 32 x 64 tile has 12.4 per HMMA, but half its rows and a
# quarter of its columns are padding there), 12.25 for 32, TF32 40.25 (words, no ldmatrix; 4 GEMM HMMA).  With the
# stage offsets recomputed in the loop: 25.4, 13.4, 40.0.  About 5-7% above those.
WEIGHT_GROUPS_LOOP_PER_HMMA = {("16-bit", 16): 24.5, ("16-bit", 32): 13.1, ("float", 16): 42.5}


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_weight_groups_main_loop_is_lean(kernel_programs, sass_tools):
    """conv_bwd_weight_igemm_groups' main loop: at most WEIGHT_GROUPS_LOOP_PER_HMMA instructions per GEMM HMMA, operands
    by LDGSTS and (16-bit) LDSM, no LDG; no local memory."""
    program = kernel_programs("implicit_gemm.cu", "sm_90")
    loops, usage = main_loop_opcodes(program), resource_usage(program, "sm_90")
    problems, seen = [], 0
    for name in sass_names("implicit_gemm.cu", "sm_90"):
        if not name.startswith("conv_bwd_weight_igemm_groups<"):
            continue
        loop, tf32 = loops[name], "<float," in name
        if usage[name].local:
            problems.append(f"{name}: {usage[name].local} bytes of local memory")
        if not loop["LDGSTS"] or (not tf32 and not loop["LDSM"]) or loop["LDG"]:
            problems.append(f"{name}: LDGSTS {loop['LDGSTS']}, LDSM {loop['LDSM']}, LDG {loop['LDG']}")
        if ", int," not in name:
            continue
        seen += 1
        channels = int(name.rstrip(">").split(",")[2])
        gemm = loop["HMMA"] // 2 if tf32 else loop["HMMA"] * 4 // 5   # (the bias: TF32 2 of 4, 16-bit 1 of 5)
        per_hmma = sum(loop.values()) / gemm
        if per_hmma > WEIGHT_GROUPS_LOOP_PER_HMMA["float" if tf32 else "16-bit", channels]:
            problems.append(f"{name}: {per_hmma:.1f} instructions per GEMM HMMA")
    assert seen == 5 and not problems, "\n".join(problems)


def unit_loop_opcodes(program) -> dict[str, Counter]:
    """{name expression: Counter of SASS mnemonics} of each kernel's loop over its units: the smallest loop holding
    a barrier (BAR), i.e. what a block issues per staged tile (the weight gradient's loop over its partial rows,
    which also holds the block reduction's barriers, encloses it), every instruction counted once (both sides of a
    branch, an inner loop's body once).  Kernels without such a loop are left out."""
    result = {}
    for name, instructions in sass.disassemble(program).items():
        opcodes = [i["opcode"].split(".")[0] for i in instructions]
        with_barrier = [(a, b) for a, b in sass.loops(instructions) if "BAR" in opcodes[a:b + 1]]
        if with_barrier:
            a, b = min(with_barrier, key=lambda loop: loop[1] - loop[0])
            result[name] = Counter(opcodes[a:b + 1])
    return result


# The most SASS instructions in channels_last_copy<T, int, true>'s loop over its row tiles (sm_90, every instruction
# counted once), a trip moving one 16-byte vector a thread each way: 8 elements of a 16-bit type, 4 floats (the
# float loop also holds the tf32 rounding and the remainder, both in software).  About 10% above NVRTC 13.0's 85
# and 130 of 2026-11-25; the 32 x 32-tile kernel before (4 elements a thread and trip) had 241 and 348.
CHANNELS_LAST_COPY_LOOP = {"__half": 96, "__nv_bfloat16": 96, "float": 144}
# The same loop in channels_last_copies<T, int> (its job's arguments picked before it): 92 and 150 of task launchpair
# (the float loop reads 14 of the picked arguments from the parameter bank in the loop, ULDC, instead of registers).
CHANNELS_LAST_COPIES_LOOP = {"__half": 99, "__nv_bfloat16": 99, "float": 164}


@pytest.mark.slow
@on_program("implicit_gemm.cu", "sm_90")
def test_channels_last_copy_loop_is_lean(kernel_programs, sass_tools):
    """channels_last_copy's loop over its row tiles: at most CHANNELS_LAST_COPY_LOOP instructions, one 16-byte
    shared store and load and one 16-byte global store (whole vectors), its global loads VEC per thread, no local
    memory (spills): a division or a per-element address computation back in the loop fails here.  The same loop
    (`cl_copy_tiles`) in channels_last_copies, its job's arguments picked once per block, before the loop, and no
    integer division anywhere (its reciprocal, MUFU.RCP): a division by a job's channel blocks, ~30 instructions
    a warp before the loop, put p-seed's one-pass copy over its DRAM time (task copieslanes); its LANES-false
    instantiation shorter than its LANES one (the lanes' decode compiled out: outputs cannot tell, task lanes2)."""
    program = kernel_programs("implicit_gemm.cu", "sm_90")
    loops, whole = unit_loop_opcodes(program), sass_opcodes(program)
    problems, seen = [], 0
    for name in sass_names("implicit_gemm.cu", "sm_90"):
        if not (name.startswith("channels_last_copy<") and name.endswith(", int, true>")
                or name.startswith("channels_last_copies<")):
            continue
        seen += 1
        loop, t = loops[name], element_type(name)
        bound = (CHANNELS_LAST_COPIES_LOOP if name.startswith("channels_last_copies<") else CHANNELS_LAST_COPY_LOOP)[t]
        if sum(loop.values()) > bound:
            problems.append(f"{name}: {sum(loop.values())} instructions > {bound}")
        if loop["LDG"] != 16 // (4 if t == "float" else 2) or loop["LDL"] or loop["STL"]:
            problems.append(f"{name}: LDG {loop['LDG']}, LDL {loop['LDL']}, STL {loop['STL']}")
        if name.startswith("channels_last_copies<") and whole[name]["MUFU"]:
            problems.append(f"{name}: {whole[name]['MUFU']} MUFU (an integer division)")
        if name.endswith(", int, false>") and name.startswith("channels_last_copies<"):   # the lanes' decode out
            lanes = sum(whole[name.replace(", false>", ", true>")].values())
            if sum(whole[name].values()) >= lanes:
                problems.append(f"{name}: {sum(whole[name].values())} instructions, not fewer than LANES' {lanes}")
    assert seen == 9 and not problems, "\n".join(problems)


# The most SASS instructions per output that one thread's pass through depthwise_fwd<T, int, K, S>'s loop over its
# units may hold, its packed instantiations <T, int, K, S, true> too (sm_90; static: the unit loop's instructions
# counted once, both sides of every branch, over the thread's STRIP_ROWS[K] x FWD_COLUMNS outputs; float32, and the
# 16-bit types).  The forward before issue 25 (one
# output column per thread, divisions and staging set-up per unit) had 151/160/110/112/142/151 (float32) and
# 176/182/125/129/161/169 (float16) for 3/1, 3/2, 5/1, 5/2, 7/1, 7/2.  About 10% above the counts of NVRTC 13.0's
# code for the persistent kernel of 2026-11-25 (benchmarks/RESULTS.md, "Depthwise forward rewrite").
FORWARD_LOOP_PER_OUTPUT = {
    ("float", 3, 1): 38, ("float", 3, 2): 40, ("float", 5, 1): 56, ("float", 5, 2): 55, ("float", 7, 1): 77,
    ("float", 7, 2): 78, ("16-bit", 3, 1): 50, ("16-bit", 3, 2): 44, ("16-bit", 5, 1): 82, ("16-bit", 5, 2): 84,
    ("16-bit", 7, 1): 81, ("16-bit", 7, 2): 82,
}
# (5x5 raised by task dwlat: the packed instantiations from 5x5 on hold two staging paths, flat with batched loads and
# by rows for 16-byte-aligned rows, and this static count takes both: <T, int, 5, S, true> 1,301-1,336 -> 1,608-1,657
# instructions, 50.2-51.8 per output; the per-image ones are unchanged at 41.7-45.5.)  (16-bit 5x5 raised by task dwk5:
# its packed instantiations hold a third staging path, by 16-byte chunks (stage_chunks, unrolled over 2 chunks of 8
# elements), for fewer executed instructions (the model's count on dw-1152-7k5 fp16: 3,646 -> ~2,400 a warp): float16
# <5, 1, true> 69.2 per output, bfloat16 66.3, <5, 2, true> 70.8; about 10% above.)  (float <5, 2> 54 -> 55: 54.1 after
# dwk5's batched weight loads and dws2b's shared split-row read met in one tree, the twentieth session's merge.)
# (16-bit 3x3 stride 1 raised 41 -> 50 by task dw3s1: its per-image instantiations hold a second row staging,
# stage_rows16, beside AlignedStaging::stage, 2 rows of loads unrolled, for fewer executed instructions and waits (the
# model's count on dw-256-56 fp16: 4,621 -> 4,535 instructions, 36.9 -> 6.5 waits a warp): 44.5 per output float16,
# 45.0 bfloat16; about 10% above.)  (5x5 raised by task dwsmall, 22nd session: the packed units' weights by 16-byte
# chunks, stage_weight_chunks, with a 16-byte and an element store path both compiled in, and stage_chunks' end masks,
# for fewer executed instructions (the model's count on dw-1152-7k5: fp16 fwd 2,426 -> 2,232 a warp, fp32 3,583 ->
# 3,079): float <5, 1, true> 53.1 per output, float16 <5, 1, true> 77.9, <5, 2, true> 79.6; about 5% above.)
# The packed instantiations <T, int, K, S, true> where stage_chunks joined their element walk (task dwsmall, 24th
# session: the packed 3x3 in every dtype and the float32 5x5, for fewer executed instructions, the model's count on
# dw-480-14 fp16 1,267 -> 682 a warp, dw-480-14k5 fp32 4,065 -> 2,962): float <3, 1, true> 74.7 per output, <3, 2,
# true> 76.0, float16 78.8 / 80.1, bfloat16 72.9 / 74.7, float <5, 1, true> 72.9, <5, 2, true> 74.0; about 10% above,
# on their own so that the per-image 3x3's bounds stay tight.
PACKED_LOOP_PER_OUTPUT = {("float", 3): 83, ("16-bit", 3): 88, ("float", 5): 82}


PERSISTENT_DEPTHWISE = ("depthwise_fwd", "depthwise_bwd_input", "depthwise_bwd_weight")


def depthwise_loop_table(program, kernels=PERSISTENT_DEPTHWISE) -> list[tuple[str, int, float]]:
    """(name, unit-loop instructions, per output) of every int-indexed kernel<T, int, K[, S]> of `kernels`, fp64
    aside: the persistent depthwise kernels, whose thread items are STRIP_ROWS[K] x FWD_COLUMNS outputs."""
    from cupyconv.ops import depthwise
    loops = unit_loop_opcodes(program)
    rows = []
    for name in sass_names("depthwise.cu", "sm_90"):
        kernel, rest = name.split("<")
        if kernel not in kernels or name not in loops:
            continue
        t, index, k = [part.strip() for part in rest.rstrip(">").split(",")][:3]
        if index == "int" and t != "double":
            instructions = sum(loops[name].values())
            rows.append((name, instructions, instructions / (depthwise.STRIP_ROWS[int(k)] * depthwise.FWD_COLUMNS)))
    return rows


@pytest.mark.slow
@on_program("depthwise.cu", "sm_90")
def test_depthwise_forward_loop_stays_lean(kernel_programs):
    """depthwise_fwd's loop over its units issues at most FORWARD_LOOP_PER_OUTPUT instructions per output (sm_90,
    int; the packed instantiations PACKED_LOOP_PER_OUTPUT where it names them): an edit that brings per-unit divisions
    or set-up back into the loop fails here."""
    problems = []
    for name, instructions, per_output in depthwise_loop_table(kernel_programs("depthwise.cu", "sm_90"),
                                                               ("depthwise_fwd",)):
        t, _, k, s, *more = (part.strip() for part in name.split("<")[1].rstrip(">").split(","))  # (then PACK)
        kind = "float" if t == "float" else "16-bit"
        bound = FORWARD_LOOP_PER_OUTPUT[kind, int(k), int(s)]
        if more == ["true"]:  # PACK
            bound = PACKED_LOOP_PER_OUTPUT.get((kind, int(k)), bound)
        if per_output > bound:
            problems.append(f"{name}: {instructions} instructions in the unit loop, {per_output:.1f} per output > {bound}")
    assert not problems, "\n".join(problems)


# The same bound for the persistent input gradient (stride 1) and the weight gradient's loop over its units, about
# 10% above NVRTC 13.0's counts of 2026-11-25 (benchmarks/RESULTS.md, "Depthwise gradients rewrite"); the 5x5 input
# gradient's raised by task dwlat as the forward's (its packed instantiation: 42.1-42.6 -> 53.1-54.0 per output), and
# the 16-bit one by task dwk5 as the forward's (stage_chunks: 72.9 per output, float16), the 16-bit 3x3 by task
# dw3s1 as the forward's (stage_rows16 beside the generic staging: 53.5 per output float16, 53.6 bfloat16; 43 -> 59).
# The kernels before that (one output column per thread, divisions per unit) had, float32: input 273/115/149 per
# output for K = 3/5/7, weight 135/136/98/103/125/135 for 3/1, 3/2, 5/1, 5/2, 7/1, 7/2.
GRADIENT_LOOP_PER_OUTPUT = {
    ("depthwise_bwd_input", "float", 3, 1): 40, ("depthwise_bwd_input", "float", 5, 1): 57,
    ("depthwise_bwd_input", "float", 7, 1): 80, ("depthwise_bwd_input", "16-bit", 3, 1): 59,
    ("depthwise_bwd_input", "16-bit", 5, 1): 84, ("depthwise_bwd_input", "16-bit", 7, 1): 85,
    # (16-bit 5x5 input gradient 80 -> 84 by task dwsmall, 22nd session: float16 80.1 per output, the forward's
    # weight chunks and end masks; dw-1152-7k5 fp16: 2,492 -> 2,234 executed instructions a warp)
    ("depthwise_bwd_weight", "float", 3, 1): 35, ("depthwise_bwd_weight", "float", 3, 2): 36,
    ("depthwise_bwd_weight", "float", 5, 1): 44, ("depthwise_bwd_weight", "float", 5, 2): 46,
    ("depthwise_bwd_weight", "float", 7, 1): 70, ("depthwise_bwd_weight", "float", 7, 2): 73,
    ("depthwise_bwd_weight", "16-bit", 3, 1): 39, ("depthwise_bwd_weight", "16-bit", 3, 2): 39,
    ("depthwise_bwd_weight", "16-bit", 5, 1): 47, ("depthwise_bwd_weight", "16-bit", 5, 2): 49,
    ("depthwise_bwd_weight", "16-bit", 7, 1): 74, ("depthwise_bwd_weight", "16-bit", 7, 2): 76,
    # the PAIRS instantiations (task dwwgrad, 2026-11-26; task dw16wg, 2026-11-27): their flat staging by pairs
    # (stage_run's E = 2, 2-4 pairs a lane in flight) compiled in beside the element and chunk paths, so a longer
    # static loop (float16 3x3: 48.5 per output, 5x5: 53.0) for fewer waits (the model's executed count, dw-672-14k5
    # fp16: 152 -> 16 waited loads a warp); about 10% above
    ("depthwise_bwd_weight PAIRS", "16-bit", 3, 1): 53, ("depthwise_bwd_weight PAIRS", "16-bit", 5, 1): 58,
    # the float32 SPREAD instantiations with FLAT (task dwwg3, 2026-11-26): the flat staging of whole small planes
    # compiled in beside the row staging, its walk rebuilt each unit (divisions: kept over the loop it cost 32
    # registers), so a longer static loop (5x5: 45.8 per output) for fewer waits (the model's executed count,
    # dw-672-14k5 fp32: 150 -> 49 waited loads a warp); about 10% above
    ("depthwise_bwd_weight FLAT", "float", 3, 1): 50, ("depthwise_bwd_weight FLAT", "float", 3, 2): 51,
    ("depthwise_bwd_weight FLAT", "float", 5, 1): 50, ("depthwise_bwd_weight FLAT", "float", 5, 2): 52,
    ("depthwise_bwd_weight FLAT", "float", 7, 1): 79, ("depthwise_bwd_weight FLAT", "float", 7, 2): 81,
    # ... and the 16-bit stride-1 5x5 and 7x7 (FLAT16, task dwwgt, 2026-11-27: float16 5x5 50.6, bfloat16 51.6, float16
    # 7x7 76.4, bfloat16 77.6 per output; dw-1152-7k5 fp16: 92 -> 26 waited loads a warp); about 10% above
    ("depthwise_bwd_weight FLAT", "16-bit", 5, 1): 57, ("depthwise_bwd_weight FLAT", "16-bit", 7, 1): 85,
    # ... and the 16-bit 3x3 (RAW16, task dwwg3, 2026-11-27, twenty-first session): the raw cp.async staging and its
    # reader (4-byte loads, byte permutes, conversions) compiled in beside the chunk staging (float16 3x3 stride 1
    # 52.7 per output, bfloat16 54.6; stride 2 61.0, 64.0) for fewer executed (dw-256-56 fp16: 2,550 -> 1,968 a warp,
    # 22 -> 4 waits; dw-96-112s2: 6,745 -> 2,990, 83.5 -> 5.5); about 10% above
    ("depthwise_bwd_weight RAW16", "16-bit", 3, 1): 60, ("depthwise_bwd_weight RAW16", "16-bit", 3, 2): 70,
}


@pytest.mark.slow
@on_program("depthwise.cu", "sm_90")
def test_depthwise_gradient_loops_stay_lean(kernel_programs):
    """depthwise_bwd_input<K> and depthwise_bwd_weight<K, S>: at most GRADIENT_LOOP_PER_OUTPUT instructions per
    output in the loop over their units (sm_90, int), and no spills."""
    program = kernel_programs("depthwise.cu", "sm_90")
    usage = resource_usage(program, "sm_90")
    problems = []
    for name, instructions, per_output in depthwise_loop_table(program, PERSISTENT_DEPTHWISE[1:]):
        kernel, rest = name.split("<")
        t, _, k, *more = (part.strip() for part in rest.rstrip(">").split(","))
        s = int(more[0]) if kernel == "depthwise_bwd_weight" else 1  # (the input gradient's more: its PACK)
        pairs = kernel == "depthwise_bwd_weight" and more[2:] == ["true"]  # <T, I, K, S, SPREAD, PAIRS>
        # FLAT: SPREAD, 32-bit; 16-bit at stride 1 from SPREAD_MIN_K (FLAT16)
        flat = kernel == "depthwise_bwd_weight" and more[1:] == ["true"] and (t == "float" or s == 1 and int(k) >= 5)
        raw = kernel == "depthwise_bwd_weight" and t != "float" and k == "3" and not pairs  # RAW16
        bound = GRADIENT_LOOP_PER_OUTPUT[kernel + (" PAIRS" if pairs else " FLAT" if flat else " RAW16" if raw else ""),
                                         "float" if t == "float" else "16-bit", int(k), s]
        if kernel == "depthwise_bwd_input" and more == ["true"] and (k == "3" or k == "5" and t == "float"):
            # the packed 3x3 stages by chunks as the packed forward (task dw5: float 77.2, float16 81.6, bfloat16
            # 76.4 per output), and so does the packed float32 5x5 (task dwk5: its forward's code and 128
            # registers), so they take the forward's packed bound
            bound = PACKED_LOOP_PER_OUTPUT["float" if t == "float" else "16-bit", int(k)]
        if per_output > bound:
            problems.append(f"{name}: {instructions} instructions in the unit loop, {per_output:.1f} per output > {bound}")
        if usage[name].local:
            problems.append(f"{name}: {usage[name].local} bytes of local memory (spills)")
    assert len(problems) == 0 and usage, "\n".join(problems)


def test_check_flags_what_cannot_run():
    float_kernel, double_kernel = "k<float, int>", "k<double, int>"
    fits = Usage(registers=64, stack=0, shared=1024, local=0)
    assert launch_problems(Launch("f.cu", float_kernel, (32, 32), 47 * 1024), fits, "sm_80") == []
    # 64 registers x 1024 threads is exactly the register file; 65 round up to 72.
    assert launch_problems(Launch("f.cu", float_kernel, (1024,), 0), Usage(65, 0, 0, 0), "sm_90")
    assert launch_problems(Launch("f.cu", float_kernel, (1025,), 0), Usage(16, 0, 0, 0), "sm_90")
    # static + dynamic above 48 KiB while the dynamic part alone is not: no opt-in, the launch fails
    assert launch_problems(Launch("f.cu", float_kernel, (256,), 48 * 1024), fits, "sm_90")
    # opting in: 200 KiB fit sm_90, not sm_80
    opted = Launch("f.cu", float_kernel, (256,), 200 * 1024)
    assert launch_problems(opted, fits, "sm_90") == [] and launch_problems(opted, fits, "sm_80")
    spilling = Usage(registers=128, stack=16, shared=0, local=0)
    assert spill_problems({float_kernel: spilling, double_kernel: spilling}) == [
        f"{float_kernel}: 16 bytes of stack frame (spills), 0 bytes of local memory, 128 registers"]
    assert parse_res_usage(" Function _Z1kPf:\n  REG:30 STACK:8 SHARED:64 LOCAL:4 CONSTANT[0]:360\n") == {
        "_Z1kPf": Usage(30, 8, 64, 4)}


PROBE = """
template <typename T> __global__ void probe(T* p, int n) {
  __shared__ T staged[256];
  staged[threadIdx.x] = p[threadIdx.x];
  __syncthreads();
  p[threadIdx.x] = staged[255 - threadIdx.x] * T(3) + T(n);
}
__global__ void probe_dynamic(float* p) {
  extern __shared__ float dynamic[];
  dynamic[threadIdx.x] = p[threadIdx.x];
  __syncthreads();
  p[threadIdx.x] = dynamic[blockDim.x - 1 - threadIdx.x];
}
__global__ void probe_plain(float* p) { p[threadIdx.x] += 1.0f; }
"""


@pytest.mark.parametrize("arch", SASS_ARCHES)
def test_resources_and_opcodes_of_a_probe(arch, sass_tools):
    from test_nvrtc import check_compiles
    names = ["probe<float>", "probe<double>", "probe_dynamic", "probe_plain"]
    program = check_compiles(arch, "probe.cu", PROBE, names)
    usage = resource_usage(program, arch)
    assert {n: u.shared for n, u in usage.items()} == {"probe<float>": 1024, "probe<double>": 2048,
                                                       "probe_dynamic": 0, "probe_plain": 0}
    assert all(0 < u.registers <= 32 and u.local == 0 for u in usage.values())
    opcodes = sass_opcodes(program)
    assert opcodes["probe<float>"]["FFMA"] == 1 and opcodes["probe<double>"]["DFMA"] == 1
    assert all(opcodes[n]["LDS"] and opcodes[n]["STS"] and opcodes[n]["BAR"] for n in names[:3])
    assert not opcodes["probe_plain"]["LDS"] and opcodes["probe_plain"]["FADD"] == 1


if __name__ == "__main__":
    # The tensor-core main loops' instruction mix, as benchmarks/RESULTS.md quotes it:
    #   PYTHONPATH=.:tests python tests/test_sass.py [sm_80|sm_90]
    # and depthwise_fwd's loop over its units (static counts, per thread and per output), with its registers:
    #   PYTHONPATH=.:tests python tests/test_sass.py [sm_80|sm_90] depthwise
    from test_nvrtc import compile_file
    arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
    if sys.argv[2:] == ["depthwise"]:
        from test_nvrtc import ARCHES, nvrtc, options_for
        names = [n for n in GROUPS["depthwise.cu"] if n.split("<")[0] in PERSISTENT_DEPTHWISE and ", int," in n]
        program = nvrtc(ARCHES[arch]).compile(_device.kernel_source("depthwise.cu"), "depthwise.cu", names,
                                              options_for(arch, "depthwise.cu"))
        usage = resource_usage(program, arch)
        for name, instructions, per_output in depthwise_loop_table(program):
            print(f"{name:40} {usage[name].registers:4} registers {instructions:5} per unit  {per_output:6.1f} per output")
        sys.exit()
    for name, instructions, opcodes in tensor_core_loop_table(compile_file("implicit_gemm.cu", arch)):
        mix = " ".join(f"{op} {opcodes[op]}" for op in ("HMMA", "LDS", "STS", "LDG"))
        print(f"{name:48} {instructions:5} per chunk  {instructions / opcodes['HMMA']:5.1f} per HMMA  {mix}")


@pytest.mark.parametrize("arch", SASS_ARCHES)
def test_async_copy_header_compiles_to_ldgsts_and_ldsm(arch):
    """raw_kernels/async_copy.cuh's wrappers are the instructions: LDGSTS (cp.async of 16, 8 and 4 bytes: .128, .64
    and the plain 4-byte form), its group commit and wait (LDGDEPBAR, DEPBAR), LDSM (ldmatrix) and LDSM.16.MT88
    (.trans)."""
    opcodes = sass_opcodes(compile_async_copy_check(arch), full=True)["nvrtc_check_async_copy"]
    mnemonics = Counter(o.split(".")[0] for o in opcodes.elements())
    copies = [o for o in opcodes.elements() if o.startswith("LDGSTS")]
    assert len(copies) == 3 and sum(".128" in o for o in copies) == 1 and sum(".64" in o for o in copies) == 1, copies
    assert mnemonics["LDGSTS"] == 3 and mnemonics["LDGDEPBAR"] == 1 and mnemonics["DEPBAR"] >= 1, opcodes
    assert mnemonics["LDSM"] == 3 and any(".MT88" in o for o in opcodes), opcodes


# The most SASS instructions a tap loop of unfold.cu may issue per global load (sm_90, static count of the innermost
# loop that loads: unfold_im2col<T, I, 1> copies one tap per trip, fold_col2im loads FOLD_PLANES planes' taps per
# trip), and per 16-byte store for unfold_im2col's vector instantiations (one tap of RUN pixels per trip, its two
# vector loads kept from tap to tap and the RUN scalar loads of a row's padded ends).  NVRTC 13.0's code for the
# issue-25 rewrite: 17 (int) and 21 (long long) a tap for unfold, 85-137 a vector tap, 9-11 per load for fold;
# before the rewrite, fold's tap loop took 53-55 a load around a division by each stride.  fold_col2im's vector
# instantiations (16-bit types, task foldcopy) count per 16-byte load: their loop loads FOLD_TAPS taps of 8
# positions, two aligned vectors each, then shifts and adds them (45-47 a load).  Some slack for other compilers.
TAP_LOOP_LIMIT = {"unfold_im2col": 22, "unfold_im2col vector": 150, "fold_col2im": 12, "fold_col2im vector": 52}
# Opcodes of a run-time integer division on sm_80/sm_90: the reciprocal that 32-bit division starts from, and the
# call of the 64-bit division subroutine.  (The compiler may divide once before a loop, to count its trips.)
DIVISION_OPCODES = {"MUFU", "CALL"}


def tap_loop_table(program) -> list[tuple[str, int, int, int, set, set]]:
    """(name, instructions, loads, stores, opcodes of the innermost loop that loads, opcodes of all loops) of each
    instantiation."""
    rows = []
    for name, instructions in sass.disassemble(program).items():
        opcodes = [i["opcode"].split(".")[0] for i in instructions]
        loops = sass.loops(instructions)
        a, b = min([(a, b) for a, b in loops if "LDG" in opcodes[a:b + 1]], key=lambda loop: loop[1] - loop[0])
        in_loops = {op for first, last in loops for op in opcodes[first:last + 1]}
        tap = opcodes[a:b + 1]
        rows.append((name, b - a + 1, tap.count("LDG"), tap.count("STG"), set(tap), in_loops))
    return rows


@pytest.mark.slow
@on_program("unfold.cu", "sm_90")
def test_unfold_tap_loops_stay_lean(kernel_programs, sass_tools):
    """unfold_im2col's and fold_col2im's tap loops stay within TAP_LOOP_LIMIT instructions per load (or store) and never
    divide, and the int instantiations divide in no loop at all (FastDivmod with the host's multipliers; long long
    splits each unit's index by a 64-bit division, once per unit): an edit that brings a division or per-tap index
    arithmetic back fails here.  Before issue 25 every instantiation divided in its loops."""
    problems = []
    for name, instructions, loads, stores, tap_loop, in_loops in tap_loop_table(kernel_programs("unfold.cu", "sm_90")):
        kernel, vector = name.split("<")[0], name.split("<")[1].split(", ")[2].rstrip(">") != "1"   # RUN
        per_store = vector and kernel == "unfold_im2col"
        per, limit = (instructions / (stores if per_store else loads),
                      TAP_LOOP_LIMIT[kernel + " vector" if vector else kernel])
        if per > limit:
            problems.append(f"{name}: {instructions} instructions for {stores if per_store else loads} "
                            f"{'stores' if per_store else 'loads'} in its tap loop (limit {limit} each)")
        divides = (in_loops if name.split(",")[1].strip(" >") == "int" else tap_loop) & DIVISION_OPCODES
        if divides:
            problems.append(f"{name}: divides at run time in a loop ({sorted(divides)})")
    assert not problems, "\n".join(problems)


# conv.cu's direct kernels for few channels per group (sm_90, int, 16- and 32-bit): the most instructions their
# main loops issue per FFMA, about 6% above NVRTC 13.0's code (conv_fwd_direct's 3 x 3 stride-1 sliding loop,
# DIRECT_ROWS x DPT outputs over one kernel column: 8 rows on 2026-11-26, DPT 2 1.69, 4 1.34, 8 1.21; 7 rows on
# 2026-11-27, 1.71, 1.42, 1.23; the general loop before it, one pixel a thread, had 2 shared loads and ~3 address
# instructions per 4 FFMA; conv_bwd_weight_direct's 3 x 3 sliding row loop, two rows a trip (WGRAD_SLIDE_UNROLL) of
# 4 x 9 FFMA a lane: 1.33, one row a trip 1.53, its general loop 1.97).
WGRAD_SLIDE_UNROLL = 2
DIRECT_LOOP_INSTRUCTIONS_PER_FFMA = {("conv_fwd_direct", 2): 1.81, ("conv_fwd_direct", 4): 1.5,
                                     ("conv_fwd_direct", 8): 1.3, ("conv_bwd_weight_direct", 0): 1.41}
# conv_fwd_direct's registers a thread at most (its __launch_bounds__, direct_min_blocks): what keeps three 7- or
# 8-warp blocks (DPT 4) and four 4-warp blocks (DPT 8) on an SM, the occupancy its plans are predicted with.
DIRECT_FWD_REGISTERS = {2: 64, 4: 80, 8: 128}


@pytest.mark.slow
@on_program("conv.cu", "sm_90")
def test_direct_conv_loops_stay_lean(kernel_programs):
    """conv_fwd_direct's main loop is its sliding 3 x 3 loop (DIRECT_ROWS x 3 x DPT FFMA, each input value of the
    column read once: DIRECT_ROWS + 2 shared loads, and the weights of 3 taps in 16-byte vectors, or 8-byte ones for
    DPT 2), conv_bwd_weight_direct's its 3 x 3 sliding row loop (WGRAD_DPT x WGRAD_KT FFMA a row, a new row of 3
    x values and one grad_output vector: 4 shared loads; two rows a trip), each within
    DIRECT_LOOP_INSTRUCTIONS_PER_FFMA, and neither spills (conv_fwd_direct within DIRECT_FWD_REGISTERS): a load
    or an address computation per FMA back in the loop, or the register cap gone, fails here."""
    from cupyconv.ops import conv
    program = kernel_programs("conv.cu", "sm_90")
    code, usage = sass.disassemble(program), resource_usage(program, "sm_90")
    problems = []
    for name in sass_names("conv.cu", "sm_90"):
        kernel, rest = name.split("<")
        args = [part.strip() for part in rest.rstrip(">").split(",")]
        if kernel not in ("conv_fwd_direct", "conv_bwd_weight_direct") or args[0] == "double" or args[1] != "int":
            continue
        dpt = int(args[2]) if kernel == "conv_fwd_direct" else 0
        ffma_wanted = conv.DIRECT_ROWS * 3 * dpt if dpt else conv.WGRAD_DPT * conv.WGRAD_KT * WGRAD_SLIDE_UNROLL
        loads_wanted = conv.DIRECT_ROWS + 2 + 3 * max(1, dpt // 4) if dpt else (3 + 1) * WGRAD_SLIDE_UNROLL
        rule, loop = sass.main_loop(code[name])
        ffma, lds, total = loop["FFMA"], loop["LDS"], sum(loop.values())
        if rule != "fma" or ffma != ffma_wanted or lds != loads_wanted \
                or total > DIRECT_LOOP_INSTRUCTIONS_PER_FFMA[kernel, dpt] * ffma:
            problems.append(f"{name}: {rule} loop of {total} instructions, {ffma} FFMA (want {ffma_wanted}), {lds} "
                            f"LDS (want {loads_wanted})")
        if usage[name].local or usage[name].stack:
            problems.append(f"{name}: {usage[name].stack} bytes of stack, {usage[name].local} of local memory")
        if dpt and usage[name].registers > DIRECT_FWD_REGISTERS[dpt]:
            problems.append(f"{name}: {usage[name].registers} registers (at most {DIRECT_FWD_REGISTERS[dpt]})")
    assert not problems and usage, "\n".join(problems)
