"""wgmma (raw_kernels/wgmma.cuh): built for sm_90a through the path cupyconv compiles with at run time, and
emulated with the hardware's rules (tests/emulator/include/emu_wgmma.h) on a self-test kernel
(tests/emulator/selftest_kernels/wgmma.cu).

Building: CuPy 14 appends -arch=sm_<capability> to the options itself; cupyconv adds -arch=sm_90a before it for a
file declared `KernelFile(..., sm90a=True)` on a 9.0 GPU (`KernelFile.arch_options`).  The test runs CuPy's own
compile-and-cache function (cupy/cuda/compiler.py `_compile_with_cache_cuda`, with the device queries and the
module load replaced, since there is no GPU here): the options CuPy hands NVRTC, the cache entry apart from the
plain sm_90 one, HGMMA in the SASS.  Also with CUDA 12.9's NVRTC, the one cupy-cuda12x uses on a GPU machine.

Emulating: C = A B^T compared with NumPy for N = 8, 64, 128, both 16-bit types and tf32 (float operands, k8 steps of
the same 32 bytes), every descriptor layout (the interleaved core matrices and the 32-, 64- and 128-byte swizzles),
two warpgroups a block, both thread orders; tf32 operands read as the tensor cores read them (a float's 13 low
mantissa bits ignored); then each rule broken once: the launch fails (or, for accumulators read before the wait,
holds poison).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy
import pytest

from cupyconv import _device
from cupyconv._kernels import KernelFile
from emulator import SELFTEST_KERNEL_DIR, EmulatedDevice, KernelFailure, LaunchConfigError

SOURCE = "wgmma.cu"
TYPES = {"__half": numpy.float16, "__nv_bfloat16": "bfloat16", "float": numpy.float32}   # float: tf32
NS = (8, 64, 128)
NAMES = [f"wgmma_gemm<{t}, {n}>" for t in TYPES for n in NS]
INSTANTIATIONS = [(SOURCE, name) for name in NAMES]
# What NVRTC compiles (CI time: a second or two each): every N and both types once, or one of them.
BUILT = ["wgmma_gemm<__half, 8>", "wgmma_gemm<__nv_bfloat16, 64>", "wgmma_gemm<__half, 128>", "wgmma_gemm<float, 64>"]
SWIZZLES = {"interleave": 0, "128B": 1, "64B": 2, "32B": 3}  # raw_kernels/wgmma.cuh WgmmaSwizzle
# wgmma.cu's Bug
CORRECT, NO_FENCE, NO_FENCE_AFTER_WAIT, WAIT_TOO_FEW, WRITE_OPERAND, WRITE_ACCUMULATOR, NO_PROXY_FENCE, \
    OTHER_DESCRIPTOR, PARTIAL, READ_EARLY, OFF_PATTERN, CP_ASYNC, READ_AFTER_WAIT_ONE, FENCE_BEFORE_LANDING = range(14)
STEPS = 4  # k steps of 32 bytes: K = 64 (16-bit types), 32 (tf32)
TF32_IGNORED = 0x1FFF   # the low mantissa bits of a float that the tensor cores do not read as tf32


def k_step(dtype: str) -> int:
    return 8 if dtype == "float" else 16


def bf16_bits(x: numpy.ndarray) -> numpy.ndarray:
    """float32 values exactly representable in bfloat16 as their uint16 bit patterns."""
    return (numpy.ascontiguousarray(x, numpy.float32).view(numpy.uint32) >> 16).astype(numpy.uint16)


def operands(dtype: str, n: int, seed: int, exact: bool):
    """(a as passed, b as passed, a and b in float64 as the tensor cores read them): 64 x K and n x K.  exact:
    multiples of 1/8 in [-4, 4), whose products and sums float32 holds exactly, so that any order of summation gives
    the same bits; tf32 ones with random low mantissa bits besides, which the tensor cores must ignore."""
    rng = numpy.random.default_rng(seed)
    shape_a, shape_b = (64, k_step(dtype) * STEPS), (n, k_step(dtype) * STEPS)
    if exact:
        a, b = (rng.integers(-32, 32, s) / 8 for s in (shape_a, shape_b))
    else:
        a, b = (rng.standard_normal(s) for s in (shape_a, shape_b))
    if dtype == "__half":
        a, b = a.astype(numpy.float16), b.astype(numpy.float16)
        return a, b, a.astype(numpy.float64), b.astype(numpy.float64)
    if dtype == "float":
        a, b = a.astype(numpy.float32), b.astype(numpy.float32)
        if exact:   # exact values and any low bits: the same tf32
            a, b = ((x.view(numpy.uint32) | rng.integers(0, TF32_IGNORED + 1, x.shape, numpy.uint32)).view(
                numpy.float32) for x in (a, b))
        read = ((x.view(numpy.uint32) & ~numpy.uint32(TF32_IGNORED)).view(numpy.float32) for x in (a, b))
        return a, b, *(x.astype(numpy.float64) for x in read)
    a32, b32 = (bf16_bits(x.astype(numpy.float32)).astype(numpy.uint32) << 16 for x in (a, b))
    a64, b64 = (x.view(numpy.float32).astype(numpy.float64) for x in (a32, b32))
    return bf16_bits(a64), bf16_bits(b64), a64, b64


def expected(a64, b64) -> numpy.ndarray:
    """C as the kernel forms it: one wgmma a k step, each rounding its sum (with the previous D) to float once."""
    c = numpy.zeros((a64.shape[0], b64.shape[0]), numpy.float32)
    step = a64.shape[1] // STEPS
    for s in range(STEPS):
        k = slice(step * s, step * s + step)
        c = (c.astype(numpy.float64) + a64[:, k] @ b64[:, k].T).astype(numpy.float32)
    return c


def run(dtype="__half", n=64, swizzle=1, bug=CORRECT, order="forward", block=256, seed=0, exact=True):
    """(c, expected C) of wgmma_gemm on the emulator."""
    device = EmulatedDevice(order, kernel_dir=SELFTEST_KERNEL_DIR, instantiations=INSTANTIATIONS)
    a, b, a64, b64 = operands(dtype, n, seed, exact)
    c = device.empty((max(1, block // 128), 64, n), numpy.float32)
    device.launch(SOURCE, f"wgmma_gemm<{dtype}, {n}>", 1, block,
                  [a, b, c, numpy.int32(STEPS), numpy.int32(swizzle), numpy.int32(bug)])
    return c, expected(a64, b64)


# ---------------------------------------------------------------------------------------------------------
# Emulated: results


@pytest.mark.parametrize("swizzle", SWIZZLES.values(), ids=SWIZZLES.keys())
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("dtype", TYPES)
def test_wgmma_matches_numpy(dtype, n, swizzle):
    """Both warpgroups of the block: the exact C (data whose sums float32 holds exactly)."""
    c, want = run(dtype, n, swizzle)
    for slice_ in c:
        numpy.testing.assert_array_equal(slice_, want)


@pytest.mark.parametrize("order", ("forward", "reverse"))
@pytest.mark.parametrize("dtype", TYPES)
def test_wgmma_of_random_data(dtype, order):
    """Normal random operands, rounded sums: within float32's rounding of each k step's sum."""
    c, want = run(dtype, 128, 2, order=order, seed=3, exact=False)
    for slice_ in c:
        numpy.testing.assert_allclose(slice_, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Emulated: each rule broken


def _line(text: str) -> int:
    """The line of wgmma.cu that contains `text` (once)."""
    lines = [i for i, line in enumerate((SELFTEST_KERNEL_DIR / SOURCE).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


BROKEN = {
    NO_FENCE: rf"wgmma at \S*wgmma.cu:{_line('(d, bug == OTHER_DESCRIPTOR')}: no wgmma.fence since",
    NO_FENCE_AFTER_WAIT: rf"wgmma at \S*wgmma.cu:{_line('desc_a(s), tile_desc(b_tile, s')}: no wgmma.fence since",
    WAIT_TOO_FEW: rf"ended with the wgmma at \S*wgmma.cu:{_line('desc_a(s), tile_desc(b_tile, s')} in flight",
    WRITE_OPERAND: r"shared memory at 0x[0-9a-f]+ that it reads changed before the wgmma.wait_group",
    WRITE_ACCUMULATOR: r"thread \(0,0,0\) wrote its accumulator 0 while the wgmma was in flight",
    NO_PROXY_FENCE: r"thread \(7,0,0\) did not wgmma_fence_shared\(\) \(fence.proxy.async\)",
    OTHER_DESCRIPTOR: r"thread \(5,0,0\) gives other descriptors, shape or scale-d than thread \(0,0,0\)",
    PARTIAL: r"deadlock: thread \(0,0,0\) waits at a warp operation .*wgmma.cu:\d+, but thread \(96,0,0\) of its "
             r"warpgroup waits at a warp operation .*wgmma.cu:\d+",
    OFF_PATTERN: r"A's 128-byte swizzle starts at shared byte \d+ with a stride of 1024: an 8-row group must start "
                 r"on a 1024-byte boundary",
    CP_ASYNC: r"row 0 of A is at 0x[0-9a-f]+, which a cp.async of thread 0 \(at \S*wgmma.cu:\d+\) still has in "
              r"flight",
    FENCE_BEFORE_LANDING: r"cp.async copies of thread \(0,0,0\) landed after its last wgmma_fence_shared\(\)",
}


@pytest.mark.parametrize("bug", BROKEN)
def test_broken_rule_fails(bug):
    with pytest.raises(KernelFailure, match=BROKEN[bug]):
        run(bug=bug)


@pytest.mark.parametrize("bug", (READ_EARLY, READ_AFTER_WAIT_ONE))
def test_accumulators_are_poison_until_the_wait(bug):
    """Before any wait, and after a wait that retires the older k steps but not the last one, which writes the
    same registers: poison (the older steps' D never shows)."""
    c, _ = run(bug=bug)
    assert numpy.isnan(c).all()


@pytest.mark.parametrize("block", (96, 160))
def test_a_partial_warpgroup_fails(block):
    with pytest.raises(KernelFailure, match=rf"a wgmma operation at \S*wgmma.cu:\d+ in a warpgroup of "
                                            rf"{block % 128} threads; it needs all 128"):
        run(block=block)


# ---------------------------------------------------------------------------------------------------------
# On an H100 or H200: the emulator's reading of the layouts, checked against the hardware


@pytest.mark.gpu
@pytest.mark.parametrize("swizzle", SWIZZLES.values(), ids=SWIZZLES.keys())
@pytest.mark.parametrize("dtype", TYPES)
def test_wgmma_on_the_gpu(dtype, swizzle):
    """The self-test kernel built as CudaDevice would build an sm90a file: the same exact C as NumPy's (data whose
    sums the tensor cores' adder holds exactly), in every layout, for every N."""
    import cupy
    if int(cupy.cuda.Device().compute_capability) != 90:
        pytest.skip("wgmma needs a compute capability 9.0 GPU (sm_90a)")
    options = ("-std=c++17", *KernelFile(SOURCE, sm90a=True).arch_options(90))
    module = cupy.RawModule(code=nvrtc_source(), options=options, name_expressions=NAMES)
    for n in NS:
        a, b, a64, b64 = operands(dtype, n, n, exact=True)
        c = cupy.full((2, 64, n), numpy.nan, numpy.float32)
        module.get_function(f"wgmma_gemm<{dtype}, {n}>")(
            (1,), (256,), (cupy.asarray(a), cupy.asarray(b), c, numpy.int32(STEPS), numpy.int32(swizzle),
                           numpy.int32(CORRECT)))
        for slice_ in cupy.asnumpy(c):
            numpy.testing.assert_array_equal(slice_, expected(a64, b64), err_msg=f"N = {n}")


# ---------------------------------------------------------------------------------------------------------
# Built for sm_90a


def nvrtc_source() -> str:
    """wgmma.cu with its raw_kernels/ headers inlined (NVRTC gets no include path for them)."""
    text = (SELFTEST_KERNEL_DIR / SOURCE).read_text()
    return re.sub(r'^#include "\.\./\.\./\.\./raw_kernels/([^"]+)"$',
                  lambda m: _device.kernel_source(m.group(1)), text, flags=re.M)


def test_arch_options():
    """-arch=sm_90a only for an sm90a file on a 9.0 GPU (wgmma_conv.cu, the one shipped); every other file keeps
    the same options everywhere."""
    wgmma = KernelFile("wgmma.cu", sm90a=True)
    assert wgmma.arch_options(90) == ("-arch=sm_90a",)
    assert wgmma.arch_options(80) == wgmma.arch_options(100) == wgmma.arch_options(None) == ()
    assert KernelFile("conv.cu").arch_options(90) == ()
    files = _device.kernel_files()
    assert [name for name, kernels in files.items() if kernels.sm90a] == ["wgmma_conv.cu"]
    for filename, kernels in files.items():
        arch = ("-arch=sm_90a",) if kernels.sm90a else ()
        assert _device.compile_options(filename, 90) == (*_device.compile_options(filename, 80), *arch)
        assert _device.compile_options(filename, 80) == _device.compile_options(filename)


class RecordingCache:
    """CuPy's kernel cache backend, recording what is stored (nothing is loaded: every call compiles)."""
    def __init__(self):
        self.saved = {}

    def load(self, name):
        return None

    def save(self, name, payload, source):
        self.saved[name] = payload


@pytest.fixture
def cupy_compile(monkeypatch):
    """compile(options, arch, names) -> (options NVRTC got, cache entry name, cubin) through CuPy's own
    `_compile_with_cache_cuda`, with the GPU queries and the module load stubbed."""
    compiler = pytest.importorskip("cupy.cuda.compiler")
    try:
        compiler._get_nvrtc_version()
    except Exception as e:  # noqa: BLE001 (CuPy raises its own types when it finds no NVRTC)
        pytest.skip(f"CuPy finds no NVRTC: {e}")
    include = pytest.importorskip("benchmarks.sass").nvrtc(13).include

    class Module:
        def load(self, cubin):
            self.cubin = cubin

        def _set_mapping(self, mapping):
            self.mapping = mapping

    cache = RecordingCache()
    monkeypatch.setattr(compiler, "_get_arch_for_options_for_nvrtc", lambda arch=None: (f"-arch=sm_{arch}", "cubin"))
    monkeypatch.setattr(compiler.function, "Module", Module)
    monkeypatch.setattr(compiler, "_kernel_cache_backend", cache)
    seen = []
    compile_program = compiler._NVRTCProgram.compile

    def spy(self, options=(), log_stream=None):
        seen.append(options)
        return compile_program(self, options, log_stream)

    monkeypatch.setattr(compiler._NVRTCProgram, "compile", spy)

    def compile(options, arch, names):
        before = set(cache.saved)
        module = compiler._compile_with_cache_cuda(nvrtc_source(), (*options, f"-I{include}"), arch,
                                                   name_expressions=names)
        (entry,) = set(cache.saved) - before
        return seen[-1], entry, module.cubin

    return compile


def hgmma_kernels(cubin: bytes) -> int:
    """How many kernels of a cubin hold an HGMMA instruction (nvdisasm)."""
    sass = pytest.importorskip("benchmarks.sass")
    try:
        kernels = sass._disassemble_cubin(cubin)
    except sass.ToolMissing as e:
        pytest.skip(str(e))
    return sum(any(i["opcode"].startswith("HGMMA") for i in instructions) for instructions in kernels.values())


def own_nvrtc(major: int):
    sass = pytest.importorskip("benchmarks.sass")
    try:
        return sass.nvrtc(major)
    except sass.ToolMissing as e:
        pytest.skip(str(e))


# ptxas's notes on the bug branches of wgmma.cu (divergent: it injects warpgroup.arrive there)
INJECTED = re.compile(r"^ptxas info\s*: \((C7519|C7520)\) .*$\n?", re.M)


def test_cupy_builds_sm90a(cupy_compile):
    """The options of an sm90a file on a 9.0 GPU through CuPy: NVRTC gets -arch=sm_90a, then CuPy's -arch=sm_90,
    compiles every kernel with HGMMA, and the cache entry differs from the plain sm_90 one, whose kernels trap.
    CuPy's binding returns the cubin less its last byte, a zero (the driver loads it; nvdisasm wants it back)."""
    wgmma = KernelFile(SOURCE, sm90a=True)

    def built(options, arch, names):
        seen, entry, cubin = cupy_compile(options, arch, names)
        return seen, entry, cubin + b"\0"

    options, entry, cubin = built(("-std=c++17", *wgmma.arch_options(90)), "90", BUILT)
    assert options.index("-arch=sm_90a") < options.index("-arch=sm_90")
    assert hgmma_kernels(cubin) == len(BUILT)
    plain_options, plain_entry, plain_cubin = built(("-std=c++17", *wgmma.arch_options(80)), "90", BUILT[:1])
    assert "-arch=sm_90a" not in plain_options and plain_entry != entry
    assert hgmma_kernels(plain_cubin) == 0
    _, _, sm80_cubin = built(("-std=c++17", *wgmma.arch_options(80)), "80", BUILT[:1])
    assert hgmma_kernels(sm80_cubin) == 0


@pytest.mark.parametrize("major", (12, 13))
def test_nvrtc_builds_sm90a(major):
    """CUDA 12.9's NVRTC (cupy-cuda12x's on a GPU machine) and 13's with CuPy's order of the two -arch options:
    sm_90a, HGMMA in every kernel, no warning, nothing serialised on the correct path alone.  ptxas's notes: with
    the divergent bug branches, injected warpgroup.arrive (C7519) and serialised wgmmas (C7520); on the correct
    path alone none from CUDA 13's ptxas, and from 12.9's four C7519 a kernel (it injects warpgroup.arrive where
    13's does not), never C7520."""
    nvrtc = own_nvrtc(major)
    options = ["-std=c++17", "-arch=sm_90a", "-arch=sm_90", f"-I{nvrtc.include}"]
    if major == 12:  # (13's compile of the bug branches is test_cupy_builds_sm90a's)
        program = nvrtc.compile(nvrtc_source(), SOURCE, BUILT[:1], options)
        assert program.ok and not INJECTED.sub("", program.log).strip(), program.log
        assert hgmma_kernels(program.cubin) == 1
    clean = nvrtc.compile(nvrtc_source(), SOURCE, BUILT[1:2], [*options, "-DWGMMA_SELFTEST_CLEAN"])
    assert clean.ok and "C7520" not in clean.log, clean.log
    assert not (INJECTED.sub("", clean.log).strip() if major == 12 else clean.log), clean.log
    assert hgmma_kernels(clean.cubin) == 1
