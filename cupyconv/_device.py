"""Executors for the kernel path.

Each op writes its kernel orchestration (grid sizes, workspace chunks, GEMMs, launches) once against the small
`Device` interface below.  `CudaDevice` runs it on a GPU with CuPy; the test suite's `EmulatedDevice`
(tests/emulator) runs the very same `raw_kernels/` source on NumPy buffers.

Kernels are named by (source file, name expression), e.g. ("unfold.cu", "unfold_im2col<float, int>").  Each
op module exposes `instantiations()`, every (file, name expression) it can launch, built by the same function
that names a kernel at launch; the NVRTC check in the tests compiles exactly that list.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
import re
from pathlib import Path

import numpy

OPS = ("unfold", "conv", "depthwise", "patch")

_C_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double"}
INT32_MAX = 2**31 - 1
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


def c_type(dtype) -> str:
    """The CUDA C element type of a NumPy/CuPy dtype."""
    return _C_TYPES[numpy.dtype(dtype).name if not isinstance(dtype, str) else dtype]


KERNEL_DTYPES = ("float16", "bfloat16", "float32", "float64")  # every kernel is instantiated for each
INDEX_TYPES = ("int", "long long")


def kernel_name(kernel: str, dtype, index: str, *constants) -> str:
    """The name expression of one instantiation, kernel<T, I, constants...>: e.g. kernel_name("patch_fwd",
    numpy.float32, "int", 4, 4, 3, 3) is "patch_fwd<float, int, 4, 4, 3, 3>"."""
    return f"{kernel}<{', '.join((c_type(dtype), index, *map(str, constants)))}>"


def index_type(*extents: int) -> str:
    """'int' when every flat index of every buffer fits in 32 bits, else 'long long' (64-bit)."""
    return "int" if max(extents, default=0) <= INT32_MAX else "long long"


def index_types(*extents: int):
    """The kernel index type for buffers of these extents, and the NumPy scalar type its arguments take."""
    index = index_type(*extents)
    return index, numpy.int32 if index == "int" else numpy.int64


ELEMENTWISE_BLOCK = 256
_MAX_GRID_BLOCKS = 65536  # enough blocks to fill any current GPU; grid-stride loops cover the rest


def elementwise_launch(total: int, block: int = ELEMENTWISE_BLOCK):
    """(grid, block) for a grid-stride kernel over `total` items (total > 0)."""
    return (min(-(-total // block), _MAX_GRID_BLOCKS),), (block,)


def element_strides(a) -> list[int]:
    """Strides of a NumPy/CuPy array in elements (both libraries keep them in bytes)."""
    return [s // a.itemsize for s in a.strides]


def extent(a) -> int:
    """One past the largest flat element offset any index of `a` can reach from its first element."""
    return 1 + sum(abs(s) * (d - 1) for s, d in zip(element_strides(a), a.shape)) if a.size else 0


def all_instantiations() -> list[tuple[str, str]]:
    """Every (source file, name expression) that some op can launch."""
    result = []
    for op in OPS:
        module = importlib.import_module(f"cupyconv.ops.{op}")
        result.extend(module.instantiations())
    return sorted(set(result))


class Device:
    """What an op's kernel path needs from an executor."""

    xp = numpy
    name = "abstract"

    def launch(self, source: str, name: str, grid, block, args, shared_mem: int = 0) -> None:
        """Launch kernel `name` (a name expression) of raw_kernels/`source` on the current stream."""
        raise NotImplementedError

    def matmul(self, a, b, out=None):
        """Batched matmul with broadcasting; float16/bfloat16 operands accumulate in float32 (like cuBLAS)."""
        if a.dtype.itemsize == 2:
            result = self.xp.matmul(a.astype(numpy.float32), b.astype(numpy.float32)).astype(a.dtype)
            if out is None:
                return result
            out[...] = result
            return out
        return self.xp.matmul(a, b, out=out)

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=dtype)


class CudaDevice(Device):
    """CuPy arrays, NVRTC-compiled RawModules (memoised per device), cuBLAS through cupy.matmul."""

    name = "cuda"

    def __init__(self):
        import cupy
        self.xp = cupy

    def matmul(self, a, b, out=None):
        # cuBLAS accumulates float16/bfloat16 GEMMs in float32 itself (tensor cores where available).
        return self.xp.matmul(a, b, out=out)

    def launch(self, source, name, grid, block, args, shared_mem=0):
        kernel = _cuda_function(source, name)
        if shared_mem > DEFAULT_SHARED_LIMIT and kernel.max_dynamic_shared_size_bytes < shared_mem:
            # Above 48 KiB a kernel must opt in to dynamic shared memory, or the launch fails.
            kernel.max_dynamic_shared_size_bytes = shared_mem
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)


def _cuda_compile_options() -> tuple[str, ...]:
    return ("-std=c++17", "--use_fast_math") if os.environ.get("CUPYCONV_FAST_MATH") else ("-std=c++17",)


@functools.lru_cache(maxsize=None)
def _cuda_function_on(device_id: int, source: str, name: str):
    import cupy
    module = cupy.RawModule(code=kernel_source(source), options=_cuda_compile_options(),
                            name_expressions=(name,))
    return module.get_function(name)


def _cuda_function(source: str, name: str):
    """The compiled kernel for the current CUDA device (modules are per device; CuPy caches binaries on disk)."""
    import cupy
    return _cuda_function_on(cupy.cuda.Device().id, source, name)


_forced_device: contextvars.ContextVar = contextvars.ContextVar("cupyconv_forced_device", default=None)


@contextlib.contextmanager
def use_device(device: Device):
    """Route NumPy arrays through `device`'s kernel path instead of the CPU path (used by the test emulator)."""
    token = _forced_device.set(device)
    try:
        yield device
    finally:
        _forced_device.reset(token)


def executor_for(xp):
    """None for the NumPy CPU path, else the Device that runs the kernel path for arrays of module xp."""
    if xp is numpy:
        return _forced_device.get()
    return CudaDevice()
