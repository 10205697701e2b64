"""Executors for the GPU path, and where kernel sources come from.

Each op writes its GPU orchestration (plans, workspace chunks, GEMMs, launches) once against the small
`Device` interface below.  `CudaDevice` runs it on a GPU with CuPy; the test suite's `EmulatedDevice`
(tests/emulator) runs the very same `raw_kernels/` source on NumPy buffers.

Kernels are named by (source file, name expression), e.g. ("unfold.cu", "unfold_im2col<float, int>").  Each
op module declares its kernel file (`KERNELS`, a `_kernels.KernelFile`) and lists in `instantiations()` every
name expression it can launch; the NVRTC check in the tests compiles exactly that list, with the options of
`compile_options()`, as CuPy does.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
import re
import time
from pathlib import Path

import numpy

from . import settings

OPS = ("unfold", "conv", "depthwise", "patch")
DEFAULT_SHARED_LIMIT = 48 * 1024  # static + dynamic shared memory a block gets without opting in


def kernel_dir() -> Path:
    """raw_kernels/: inside the installed package, or at the top of a source checkout."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "raw_kernels", package.parent / "raw_kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"cupyconv: raw_kernels/ not found next to {package}")


@functools.lru_cache(maxsize=None)
def kernel_source(filename: str) -> str:
    """The source of raw_kernels/<filename> with its local #include "..." lines inlined.

    Inlining makes the text CuPy hashes for its disk cache cover the headers too, so editing a header can never
    load a stale binary, and NVRTC needs no include path for our own files.
    """
    directory = kernel_dir()

    def expand(name: str, seen: set) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = (directory / name).read_text()
        return re.sub(r'^\s*#include\s+"([^"]+)"\s*$', lambda m: expand(m.group(1), seen), text, flags=re.M)

    return expand(filename, set())


def _op_modules():
    return [importlib.import_module(f"cupyconv.ops.{op}") for op in OPS]


def kernel_files() -> dict:
    """{filename: KernelFile} of every op's kernel file."""
    return {module.KERNELS.filename: module.KERNELS for module in _op_modules()}


def compile_options(filename: str) -> tuple[str, ...]:
    """The options every compiler of raw_kernels/<filename> gets (CuPy, the NVRTC check, the emulator): the
    C++ standard and the file's shared constants (`KernelFile.defines`, as -D options)."""
    kernels = kernel_files().get(filename)
    fast_math = ("--use_fast_math",) if os.environ.get("CUPYCONV_FAST_MATH") else ()
    return ("-std=c++17", *fast_math, *(kernels.options() if kernels else ()))


def all_instantiations() -> list[tuple[str, str]]:
    """Every (source file, name expression) that some op can launch."""
    result = []
    for module in _op_modules():
        result.extend((module.KERNELS.filename, name) for name in module.instantiations())
    return sorted(set(result))


class Device:
    """What an op's GPU path needs from an executor."""

    xp = numpy
    name = "abstract"
    tensor_cores = True  # whether mma.sync runs here (sm_80 and newer); the emulator executes it

    def launch(self, source: str, name: str, grid, block, args, shared_mem: int = 0) -> None:
        """Launch kernel `name` (a name expression) of raw_kernels/`source` on the current stream; args are in
        the C order, of the exact C types (`_kernels.KernelFile.arguments` builds them)."""
        raise NotImplementedError

    def matmul(self, a, b, out=None):
        """Every GEMM of every op: batched matmul with broadcasting, float16/bfloat16 accumulated in float32,
        float32 on TF32 tensor cores only where `settings.get_allow_tf32()` and the device has them."""
        with self.gemm_math(a.dtype):
            return self.gemm(a, b, out)

    def gemm_math(self, dtype):
        """The math mode of the GEMMs inside the block (TF32 or not); nothing to choose off the GPU."""
        return contextlib.nullcontext()

    def gemm(self, a, b, out=None):
        if a.dtype.itemsize == 2:
            result = self.xp.matmul(a.astype(numpy.float32), b.astype(numpy.float32)).astype(a.dtype)
            if out is None:
                return result
            out[...] = result
            return out
        return self.xp.matmul(a, b, out=out)

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=dtype)

    def timed(self, run):
        """(seconds, result) of run(); the wall clock here, CUDA events on the current stream on a GPU."""
        begin = time.perf_counter()
        result = run()
        return time.perf_counter() - begin, result

    def key(self):
        """What identifies this executor in the autotuning cache."""
        return (self.name, id(self))


def _cublas():
    """(CuPy's cuBLAS handle for the current device and thread, the cublas bindings)."""
    from cupy.cuda import device as cuda_device
    from cupy_backends.cuda.libs import cublas
    return cuda_device.get_cublas_handle(), cublas


class CudaDevice(Device):
    """CuPy arrays, NVRTC-compiled RawModules (memoised per device), cuBLAS through cupy.matmul."""

    name = "cuda"

    def __init__(self):
        import cupy
        self.xp = cupy

    @property
    def tensor_cores(self) -> bool:
        return int(self.xp.cuda.Device().compute_capability) >= 80

    def gemm(self, a, b, out=None):
        # cuBLAS accumulates float16/bfloat16 GEMMs in float32 itself (tensor cores where available).
        return self.xp.matmul(a, b, out=out)

    @contextlib.contextmanager
    def gemm_math(self, dtype):
        """TF32 for float32 GEMMs when the user opted in: CUBLAS_TF32_TENSOR_OP_MATH on CuPy's cuBLAS handle,
        restored right after.  (CuPy 14's `cupy._core.set_compute_type(float32, COMPUTE_TYPE_TF32)` and the
        CUPY_TF32 environment variable only reach its 2-D GEMM path, not the batched cupy.matmul used here, and
        they are process-wide.)"""
        if not (settings.get_allow_tf32() and numpy.dtype(dtype) == numpy.float32):
            yield
            return
        handle, cublas = _cublas()
        previous = cublas.getMathMode(handle)
        cublas.setMathMode(handle, cublas.CUBLAS_TF32_TENSOR_OP_MATH)
        try:
            yield
        finally:
            cublas.setMathMode(handle, previous)

    def launch(self, source, name, grid, block, args, shared_mem=0):
        kernel = _cuda_function(source, name)
        if shared_mem > DEFAULT_SHARED_LIMIT and kernel.max_dynamic_shared_size_bytes < shared_mem:
            # Above 48 KiB a kernel must opt in to dynamic shared memory, or the launch fails.
            kernel.max_dynamic_shared_size_bytes = shared_mem
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)

    def timed(self, run):
        start, stop = self.xp.cuda.Event(), self.xp.cuda.Event()
        start.record()
        result = run()
        stop.record()
        stop.synchronize()
        return self.xp.cuda.get_elapsed_time(start, stop) / 1e3, result

    def key(self):
        return ("cuda", self.xp.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _cuda_function_on(device_id: int, source: str, name: str):
    import cupy
    module = cupy.RawModule(code=kernel_source(source), options=compile_options(source), name_expressions=(name,))
    return module.get_function(name)


def _cuda_function(source: str, name: str):
    """The compiled kernel for the current CUDA device (modules are per device; CuPy caches binaries on disk)."""
    import cupy
    return _cuda_function_on(cupy.cuda.Device().id, source, name)


_forced_device: contextvars.ContextVar = contextvars.ContextVar("cupyconv_forced_device", default=None)


@contextlib.contextmanager
def use_device(device: Device):
    """Route NumPy arrays through `device`'s GPU path instead of the CPU path (used by the test emulator)."""
    token = _forced_device.set(device)
    try:
        yield device
    finally:
        _forced_device.reset(token)


def executor_for(xp):
    """None for the NumPy CPU path, else the Device that runs the GPU path for arrays of module xp."""
    if xp is numpy:
        return _forced_device.get()
    return CudaDevice()
