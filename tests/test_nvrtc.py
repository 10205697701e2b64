"""NVRTC compiles every kernel instantiation the package can launch for sm_90, and those with 32-bit indices for
sm_70 and sm_80 (`names_for`), cleanly.

No GPU and no driver are needed: NVRTC is a library.  One program per kernel file holds all of that file's name
expressions (as CuPy's RawModule does, from the same inlined source and options as CudaDevice), compiled to
SASS so ptxas runs too.  Any error, any warning (a non-empty log) or a name expression that does not resolve
fails.  CUDA 13's NVRTC no longer targets Volta, so sm_70 is compiled by CUDA 12's.  Each (file, architecture) is
at most two programs: the one tests/test_sass.py reads, fully optimised as CuPy compiles it (`sass_names`: on sm_90
every 32-bit-index instantiation and representatives of their 64-bit twins, on sm_80 representatives of the 32-bit
ones), and one of the rest with --Ofast-compile=max (`fast_names`: sm_90's other twins, every instantiation of
sm_70 and sm_80).

Each (kernel file, architecture) is compiled once per test session (`kernel_programs`) and the resulting cubin is
kept: tests/test_sass.py reads the same binaries' resource use and instructions.

Needs the wheels of the compile-check extra (never installed next to cupy-cuda12x: CuPy would take them for its
own): nvidia-cuda-nvrtc>=13,<14 nvidia-cuda-runtime>=13,<14
nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 (the runtime wheels carry cuda_fp16.h / cuda_bf16.h).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import pickle
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from cupyconv import _device

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) leaves the checkout off the path
    sys.path.append(str(ROOT))

# The NVRTC wrapper lives in benchmarks/sass.py, which benchmarks.predict imports too.
from benchmarks.sass import ARCHES, WHEELS, Nvrtc, Program, ToolMissing  # noqa: E402,F401
from benchmarks import sass  # noqa: E402


@functools.lru_cache(maxsize=None)
def nvrtc(major: int) -> Nvrtc:
    """NVRTC of CUDA `major` from the installed wheels; skips the test when they are missing."""
    try:
        return sass.nvrtc(major)
    except ToolMissing as e:
        pytest.skip(str(e))


def grouped_instantiations() -> dict[str, list[str]]:
    groups = defaultdict(list)
    for filename, name in _device.all_instantiations():
        groups[filename].append(name)
    return dict(sorted(groups.items()))


# NVRTC 12 says this of sm_70 whatever the source, and has no option to silence it: the one line not ours.
TOOLKIT_NOTICE = re.compile(r"^nvrtc: warning: Architectures prior to '<compute/sm>_75' are deprecated.*$\n?", re.M)


def options_for(arch: str, filename: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [*_device.compile_options(filename, int(arch[3:])), f"--gpu-architecture={arch}",
            f"-I{nvrtc(ARCHES[arch]).include}",
            *extra]


def check_program(program: Program, arch: str, filename: str, names: list[str]) -> None:
    """Fail on an error, a warning or a name expression that does not resolve."""
    release = "%d.%d" % nvrtc(ARCHES[arch]).version
    log = TOOLKIT_NOTICE.sub("", program.log).strip()
    assert program.ok, f"NVRTC {release} failed on {filename} for {arch}:\n{log}"
    assert not log, f"NVRTC {release} warns on {filename} for {arch} (warnings fail the build):\n{log}"
    missing = [n for n in names if n not in program.lowered]
    assert not missing, f"NVRTC {release}: name expressions of {filename} that do not resolve: {missing}"


def check_compiles(arch: str, filename: str, source: str, names: list[str]) -> Program:
    program = nvrtc(ARCHES[arch]).compile(source, filename, names, options_for(arch, filename))
    check_program(program, arch, filename, names)
    return program


GROUPS = grouped_instantiations()

# The architecture every instantiation is compiled for, those with 32-bit indices fully optimised (tests/test_sass.py
# reads all of their SASS), with representatives of their 64-bit twins (`sass_names`).
FULL_ARCHES = ("sm_90",)


def template_args(name: str) -> list[str]:
    """'depthwise_fwd<float, int, 7, 2, true>' -> ['float', 'int', '7', '2', 'true']."""
    return [a.strip() for a in name.split("<", 1)[1].rstrip(">").split(",")]


def index_type(name: str) -> str:
    """'depthwise_fwd<__half, long long, 3, 1>' -> 'long long': every kernel's second template argument (the
    convention tests/test_sass.py's index_twin relies on too)."""
    return template_args(name)[1]


# `fast_names` (sm_70's and sm_80's instantiations, sm_90's 64-bit twins outside `sass_names`) are compiled with NVRTC's
# fastest optimisation level: the C++ front end (templates, the architecture's intrinsics and `#if __CUDA_ARCH__`
# branches) and ptxas (every inline PTX instruction must exist on the architecture) still see each of them, the
# optimiser hardly runs, and nothing reads these binaries' registers or instructions (test_sass reads their static
# shared memory only).  A whole-file compile then takes about an eighth of the CPU time (depthwise.cu for sm_80: 11 s,
# not ~110 s), which was most of CI's run time; sm_90's 140 twins of depthwise.cu: 25 s, not ~100 s.
FAST_COMPILE = ("--Ofast-compile=max",)
FAST_COMPILE_FROM = (12, 8)   # the first NVRTC with the option; older ones compile these fully optimised
# The architectures whose SASS tests/test_sass.py reads from a representative subset (`sass_names`), compiled again
# fully optimised, as CuPy would compile it.
SUBSET_ARCHES = ("sm_80",)
# A subset program leaves some of a file's constexpr helpers unused (EDG's warning 177, "declared but never
# referenced"); the fast program of the same architecture (every instantiation) is the one that must have no warning
# at all.  On FULL_ARCHES the roles swap: the optimised program holds every 32-bit-index instantiation and must have
# no warning, the fast one (some 64-bit twins) is the subset.
SUBSET_OPTIONS = ("--diag-suppress=177",)


def names_for(filename: str, arch: str) -> list[str]:
    """The name expressions of raw_kernels/<filename> compiled for arch: all of them for FULL_ARCHES; for sm_70 and
    sm_80 those with 32-bit indices.  Their 64-bit twins differ in the width of integer arithmetic only, which every
    architecture has, and sm_90 compiles them (the representatives' registers and spills checked by test_sass); every
    kernel size, tile, type and variant is still compiled for Volta and Ampere, at half the NVRTC time (whole-file
    compiles are most of CI's run time: depthwise.cu's 488 instantiations took some 320-420 s of CPU on sm_90 when
    all were fully optimised)."""
    names = GROUPS[filename]
    return names if arch in FULL_ARCHES else [n for n in names if index_type(n) == "int"]


def variant(name: str) -> tuple:
    """What `representatives` groups by, whatever the index type: the kernel template, its element type and its
    non-numeric arguments ('depthwise_fwd<float, int, 7, 2, true>' -> ('depthwise_fwd', 'float', ('true',)))."""
    args = template_args(name)
    return name.split("<", 1)[0], args[0], tuple(a for a in args[2:] if not a.isdigit())


def representatives(names: list[str]) -> list[str]:
    """Of each kernel template, element type and choice of its non-numeric arguments (variants such as `true`),
    the instantiation with the largest numeric arguments (their product, then in order: kernel size x stride, tile
    rows x columns), where registers and shared memory peak: 'depthwise_fwd<float, int, 7, 2, true>' stands for the
    K = 3, 5, 7 and stride 1, 2 instantiations of its variant.  In the order of `names`."""
    best: dict[tuple, tuple] = {}
    for name in names:
        key, numbers = variant(name), tuple(int(a) for a in template_args(name)[2:] if a.isdigit())
        size = (math.prod(numbers), numbers)
        if key not in best or size > best[key][0]:
            best[key] = (size, name)
    chosen = {name for _, name in best.values()}
    return [n for n in names if n in chosen]


def sass_names(filename: str, arch: str) -> list[str]:
    """The instantiations whose optimised SASS `kernel_programs(filename, arch)` holds: on FULL_ARCHES every one with
    32-bit indices and the `representatives` of their 64-bit twins; on SUBSET_ARCHES the representatives of
    `names_for`; none elsewhere.  test_sass's checks of registers, spills, shared memory and instructions then cover
    every 32-bit-index instantiation on sm_90, and each kernel template, element type and variant at its largest size
    with 64-bit indices on sm_90 and with 32-bit ones on sm_80.

    Why a representative stands for its 64-bit twins: a twin is its 32-bit instantiation with wider index arithmetic
    (the same code, tiles, loops and shared memory), and within a template, type and variant the largest kernel size
    or tile holds the most live values, so the most registers and the first spill; test_sass bounds the registers of
    the others by those of their template, type and variant (`register_bound`).  Compiling those others fully
    optimised took some 110 s of CI's CPU for depthwise.cu alone; they are compiled fast (`fast_names`)."""
    names = names_for(filename, arch)
    if arch in FULL_ARCHES:
        wide = representatives([n for n in names if index_type(n) != "int"])
        return [n for n in names if index_type(n) == "int" or n in wide]
    return representatives(names) if arch in SUBSET_ARCHES else []


def fast_names(filename: str, arch: str) -> list[str]:
    """The instantiations of `names_for` that the fast program compiles (FAST_COMPILE): on FULL_ARCHES those outside
    `sass_names` (the 64-bit twins that are no representative), elsewhere all of them.  With the optimised program,
    every instantiation of `names_for` is compiled."""
    names = names_for(filename, arch)
    if arch in FULL_ARCHES:
        optimised = set(sass_names(filename, arch))
        return [n for n in names if n not in optimised]
    return names


def program_spec(filename: str, arch: str, sass: bool) -> tuple[list[str], list[str]]:
    """(names, options) of a program: sass=True the optimised one test_sass reads (`sass_names`), sass=False the
    fast one (`fast_names`)."""
    whole = arch in FULL_ARCHES   # the optimised program holds every 32-bit-index instantiation, the fast one not
    if sass:
        return sass_names(filename, arch), options_for(arch, filename, () if whole else SUBSET_OPTIONS)
    fast = FAST_COMPILE if nvrtc(ARCHES[arch]).version >= FAST_COMPILE_FROM else ()
    return fast_names(filename, arch), options_for(arch, filename, fast + (SUBSET_OPTIONS if whole else ()))


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock on `path` between processes (pytest-xdist workers); none where fcntl is missing."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def compile_file(filename: str, arch: str, shared_dir: str | None = None, sass: bool = True) -> Program:
    """Instantiations of raw_kernels/<filename> in one program for arch (`program_spec`): sass=True the optimised
    program test_sass reads, sass=False the fast one of the others (test_every_instantiation_compiles checks both)."""
    return _compile_file(filename, arch, shared_dir, sass)


@functools.lru_cache(maxsize=None)
def _compile_file(filename: str, arch: str, shared_dir: str | None, sass: bool) -> Program:
    """Instantiations of raw_kernels/<filename> in one program for arch, as CuPy compiles them.

    Memoised in the process; with shared_dir (pytest-xdist) also in a file there, under a lock, so that of the
    workers needing the same program one compiles it and the others wait for it and read it.  The file name
    hashes the source, the options and the NVRTC release, so an edited kernel is never read stale.
    """
    compiler = nvrtc(ARCHES[arch])
    source, (names, options) = _device.kernel_source(filename), program_spec(filename, arch, sass)
    if shared_dir is None:
        return compiler.compile(source, filename, names, options)
    key = hashlib.sha256(repr((compiler.version, source, names, options)).encode()).hexdigest()[:20]
    path = Path(shared_dir) / f"{filename}-{arch}-{key}.pickle"
    with _file_lock(path.with_suffix(".lock")):
        if path.is_file():
            return Program(*pickle.loads(path.read_bytes()))
        program = compiler.compile(source, filename, names, options)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(pickle.dumps(tuple(program)))
        partial.replace(path)
        return program


@pytest.fixture(scope="session")
def kernel_programs(tmp_path_factory):
    """programs(filename, arch, sass=True) -> Program (`compile_file`): each kernel file's programs compiled once
    per test session for each architecture, shared by this module and tests/test_sass.py (and, under pytest-xdist,
    by all workers, through the session's base temporary directory: whole-file compiles take up to a minute each)."""
    shared = None
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "nvrtc-programs"
        shared.mkdir(exist_ok=True)
    return functools.partial(compile_file, shared_dir=None if shared is None else str(shared))


def on_program(filename: str, arch: str):
    """The pytest-xdist group of the tests that read kernel_programs(filename, arch).  Under `--dist loadgroup`
    (README.md's test command) a group runs on one worker, one test after another: no worker sits idle on the lock
    of a whole-file compile that another holds (up to a few minutes each), and the groups start first, the costliest
    first (tests/conftest.py's scheduler orders them by `compile_cost`)."""
    return pytest.mark.xdist_group(f"nvrtc:{filename}:{arch}", cost=compile_cost(filename, arch))


def compile_cost(filename: str, arch: str) -> float:
    """Roughly the CPU time of a file's programs for arch, in fully optimised instantiations: those of `sass_names`,
    plus an eighth of one for each that only FAST_COMPILE compiles (its comment has the ratio)."""
    return len(sass_names(filename, arch)) + len(fast_names(filename, arch)) / 8


def program_params(arches) -> list:
    """(filename, arch) of every kernel file and architecture in arches, each in its `on_program` group."""
    return [pytest.param(f, a, marks=on_program(f, a)) for f in sorted(GROUPS) for a in sorted(arches)]


@pytest.mark.slow
@pytest.mark.parametrize("filename, arch", program_params(ARCHES))
def test_every_instantiation_compiles(filename, arch, kernel_programs):
    assert set(sass_names(filename, arch)) | set(fast_names(filename, arch)) == set(names_for(filename, arch))
    if fast_names(filename, arch):
        check_program(kernel_programs(filename, arch, sass=False), arch, filename, fast_names(filename, arch))
    if sass_names(filename, arch):   # the optimised program test_sass reads
        check_program(kernel_programs(filename, arch), arch, filename, sass_names(filename, arch))


# The common header with its helpers instantiated for every element type: also proves the toolchain works
# before any kernel file lists an instantiation.
COMMON_CHECK = """
template <typename T> __global__ void nvrtc_check_common(T* data, long long n) {
  for (long long i = grid_start<long long>(); i < n; i += grid_stride<long long>())
    data[i] = from_acc<T>(to_acc(data[i]) + acc_t<T>(1));
}
"""


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_common_header_compiles(arch):
    names = [f"nvrtc_check_common<{t}>" for t in ("__half", "__nv_bfloat16", "float", "double")]
    check_compiles(arch, "common_check.cu", _device.kernel_source("common.cuh") + COMMON_CHECK, names)


# raw_kernels/async_copy.cuh's wrappers (the emulator runs its twins, tests/emulator/include/emu_async_copy.h): the
# real PTX side, instantiated once each.  sm_80 and sm_90 compile the instructions (test_sass.py checks their SASS),
# sm_70 the traps.
ASYNC_COPY_CHECK = """
__global__ void nvrtc_check_async_copy(const uint4* in, unsigned* out, int src_bytes) {
  __shared__ __align__(16) unsigned short tile[32 * 8];
  cp_async_cg_16(tile + 8 * threadIdx.x, in + threadIdx.x, src_bytes);
  cp_async_ca_8(tile + 8 * (threadIdx.x ^ 1), in + threadIdx.x, src_bytes / 2);
  cp_async_ca_4(tile + 8 * (threadIdx.x ^ 2) + 4, in + threadIdx.x, src_bytes / 4);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  unsigned a[4], b[2], t[4];
  ldmatrix_x4(a, tile + 8 * threadIdx.x);
  ldmatrix_x2(b, tile + 8 * (threadIdx.x % 16));
  ldmatrix_x4_trans(t, tile + 8 * threadIdx.x);
  out[threadIdx.x] = a[0] ^ a[1] ^ a[2] ^ a[3] ^ b[0] ^ b[1] ^ t[0] ^ t[1] ^ t[2] ^ t[3];
}
"""


def compile_async_copy_check(arch: str) -> Program:
    return check_compiles(arch, "async_copy_check.cu", _device.kernel_source("async_copy.cuh") + ASYNC_COPY_CHECK,
                          ["nvrtc_check_async_copy"])


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_async_copy_header_compiles(arch):
    compile_async_copy_check(arch)


def test_instantiations_name_existing_files():
    directory = _device.kernel_dir()
    pairs = _device.all_instantiations()
    assert all(isinstance(f, str) and isinstance(n, str) and n for f, n in pairs)
    missing = sorted({f for f, _ in pairs if not (directory / f).is_file()})
    assert not missing, f"instantiations() name kernel files that raw_kernels/ lacks: {missing}"


@pytest.mark.parametrize("body, message", [
    ("int unused = 1;", "warns"),  # EDG's "declared but never referenced"
    ("undeclared_name = 1;", "failed"),
], ids=["warning", "error"])
def test_check_fails_on_warnings_and_errors(body, message):
    source = "template <typename T> __global__ void probe(T* p) { %s p[0] = T(0); }\n" % body
    with pytest.raises(AssertionError, match=message):
        check_compiles("sm_80", "probe.cu", source, ["probe<float>"])


def test_fast_compile_still_runs_ptxas():
    """FAST_COMPILE keeps what sm_70's and sm_80's compiles are for: ptxas rejects an instruction the architecture
    lacks (an unguarded cp.async on Volta) as it does at full optimisation."""
    if nvrtc(ARCHES["sm_70"]).version < FAST_COMPILE_FROM:
        pytest.skip("NVRTC %d.%d has no --Ofast-compile" % nvrtc(ARCHES["sm_70"]).version)
    source = '__global__ void probe(float* p) { asm volatile("cp.async.commit_group;"); p[0] = 1.0f; }\n'
    program = nvrtc(ARCHES["sm_70"]).compile(source, "probe.cu", [], ["-std=c++17", "--gpu-architecture=sm_70",
                                                                       *FAST_COMPILE])
    assert not program.ok and "requires .target sm_80" in program.log, program.log


def test_representatives_take_each_variant_at_its_largest():
    names = ["k<float, int, 3, 1>", "k<float, int, 7, 2>", "k<float, int, 5, 2>", "k<float, int, 3, 1, true>",
             "k<__half, int, 3, 1>", "t<float, int, 64, 64, 4>", "t<float, int, 128, 64, 4>", "j<float, int>"]
    assert representatives(names) == ["k<float, int, 7, 2>", "k<float, int, 3, 1, true>", "k<__half, int, 3, 1>",
                                      "t<float, int, 128, 64, 4>", "j<float, int>"]
    full = sass_names("depthwise.cu", "sm_90")
    assert "depthwise_fwd<float, int, 3, 1, true>" in full and "depthwise_fwd<float, long long, 7, 2, true>" in full
    assert "depthwise_fwd<float, long long, 3, 1, true>" in fast_names("depthwise.cu", "sm_90")
    assert not set(full) & set(fast_names("depthwise.cu", "sm_90")) and not sass_names("conv.cu", "sm_70")
    subset = sass_names("depthwise.cu", "sm_80")
    assert "depthwise_fwd<float, int, 7, 2, true>" in subset and set(subset) < set(names_for("depthwise.cu", "sm_80"))


@pytest.mark.parametrize("filename", sorted(f for f, k in _device.kernel_files().items() if k.defines))
def test_kernel_files_refuse_to_compile_without_their_shared_constants(filename):
    """The constants an op module passes as -D options are not defaulted in CUDA: without them, an #error."""
    compiler = nvrtc(13)
    options = ["-std=c++17", "--gpu-architecture=sm_80", f"-I{compiler.include}"]
    program = compiler.compile(_device.kernel_source(filename), filename, GROUPS[filename][:1], options)
    assert not program.ok and "compile_options" in program.log, program.log
