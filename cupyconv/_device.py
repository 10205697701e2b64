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
import itertools
import operator
import os
import re
import sys
import time
from pathlib import Path

import numpy

from . import settings

OPS = ("unfold", "conv", "depthwise", "patch")
# Modules of cupyconv/ops that own a kernel file without being an op (the ops share them): planners and launches.
ENGINES = ("implicit_gemm", "wgmma_gemm", "simt_gemm", "lift")
# Modules outside cupyconv/ops that own a kernel file: autotuning's timing kernel (raw_kernels/timing.cu).
TOOLS = ("cupyconv._autotune",)
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
    """The modules with a kernel file (`KERNELS`) and its `instantiations()`: cupyconv/ops' and `TOOLS`."""
    return [importlib.import_module(name) for name in (*(f"cupyconv.ops.{op}" for op in OPS + ENGINES), *TOOLS)]


def kernel_files() -> dict:
    """{filename: KernelFile} of every kernel file."""
    return {module.KERNELS.filename: module.KERNELS for module in _op_modules()}


def compile_options(filename: str, capability: int | None = None) -> tuple[str, ...]:
    """The options every compiler of raw_kernels/<filename> gets (CuPy, the NVRTC check, the emulator): the
    C++ standard and the file's shared constants (`KernelFile.defines`, as -D options); with the compute
    capability of the GPU CuPy compiles for, -arch=sm_90a where the file needs it (`KernelFile.arch_options`)."""
    kernels = kernel_files().get(filename)
    fast_math = ("--use_fast_math",) if os.environ.get("CUPYCONV_FAST_MATH") else ()
    return ("-std=c++17", *fast_math, *(kernels.options() + kernels.arch_options(capability) if kernels else ()))


def all_instantiations() -> list[tuple[str, str]]:
    """Every (source file, name expression) that some op can launch."""
    result = []
    for module in _op_modules():
        result.extend((module.KERNELS.filename, name) for name in module.instantiations())
    return sorted(set(result))


# ---------------------------------------------------------------------------------------------------------
# The GEMM call: cuBLAS's cublasGemmStridedBatchedEx, column-major, checked the same way on every device

INT_MAX = 2**31 - 1   # m, n, k, lda, ldb, ldc and batch are C `int`s in cuBLAS (and in CuPy's binding)
GEMM_DTYPES = ("float16", "bfloat16", "float32", "float64")


def gemm_compute(dtype) -> tuple[str, numpy.dtype]:
    """(cuBLAS compute type, dtype of the accumulation and of the host scalars alpha and beta) of a GEMM on
    `dtype` inputs: float16/bfloat16/float32 accumulate in float32 (CUBLAS_COMPUTE_32F), float32 on TF32
    tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) only while `settings.get_allow_tf32()`, float64 in float64
    (CUBLAS_COMPUTE_64F).  The compute type alone selects TF32: the handle's math mode is left as it is."""
    name = numpy.dtype(dtype).name
    if name == "float64":
        return "CUBLAS_COMPUTE_64F", numpy.dtype(numpy.float64)
    if name == "float32" and settings.get_allow_tf32():
        return "CUBLAS_COMPUTE_32F_FAST_TF32", numpy.dtype(numpy.float32)
    return "CUBLAS_COMPUTE_32F", numpy.dtype(numpy.float32)


def _address(array) -> int:
    """The address of an array's first element: CuPy's `data.ptr` (a device pointer), NumPy's `ctypes.data`."""
    return array.ctypes.data if isinstance(array, numpy.ndarray) else array.data.ptr


def _elements_from_pointer(array) -> int:
    """How many elements of its dtype the array reaches from its data pointer onwards."""
    if array.size == 0:
        return 0
    high = sum(s * (n - 1) for n, s in zip(array.shape, array.strides) if s > 0)
    return (high + array.itemsize) // array.itemsize


def _last_element(rows: int, cols: int, ld: int, stride: int, batch: int) -> int:
    """The largest element offset a column-major (rows x cols) batch with leading dimension ld touches."""
    return (batch - 1) * stride + (cols - 1) * ld + rows - 1


def _batch_overlaps(rows: int, cols: int, ld: int, stride: int, batch: int) -> bool:
    """Whether two matrices of the batch share an element (element (r, c) of matrix i is at
    i * stride + r + c * ld, ld >= rows)."""
    span = (cols - 1) * ld + rows
    for t in range(1, batch):
        d = t * stride
        if d >= span:
            return False
        q = d // ld   # matrices t apart collide iff d = dr + dc * ld with |dr| < rows, |dc| < cols
        if d - q * ld < rows or (q + 1 < cols and (q + 1) * ld - d < rows):
            return True
    return False


def gemm_arguments(transa, transb, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch):
    """Check a `Device.gemm_strided_batched` call; ValueError naming the parameter for anything cuBLAS would
    reject (CUBLAS_STATUS_INVALID_VALUE, an unsupported type combination, a value CuPy's `int` parameters cannot
    take) or get wrong without an error (reads or writes outside the arrays passed, c overlapping a or b or
    itself).  Returns (m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch) as Python ints."""
    for name, op in (("transa", transa), ("transb", transb)):
        if op not in ("N", "T"):
            raise ValueError(f"gemm: {name} must be 'N' or 'T', not {op!r}")
    ints = {}
    for name, value in (("m", m), ("n", n), ("k", k), ("batch", batch), ("lda", lda), ("ldb", ldb), ("ldc", ldc),
                        ("stride_a", stride_a), ("stride_b", stride_b), ("stride_c", stride_c)):
        if isinstance(value, bool):
            raise ValueError(f"gemm: {name} must be an int, not {value!r}")
        try:
            ints[name] = value = operator.index(value)
        except TypeError:
            raise ValueError(f"gemm: {name} must be an int, not {value!r}") from None
        if value < 0:
            what = "reads before the array's data pointer" if name.startswith("stride") else "is negative"
            raise ValueError(f"gemm: {name} = {value} {what}")
        if value > (2**63 - 1 if name.startswith("stride") else INT_MAX):
            raise ValueError(f"gemm: {name} = {value} does not fit cuBLAS's "
                             f"{'long long' if name.startswith('stride') else 'int'}")
    m, n, k, batch = ints["m"], ints["n"], ints["k"], ints["batch"]
    rows_a, cols_a = (m, k) if transa == "N" else (k, m)   # A and B as stored, column-major
    rows_b, cols_b = (k, n) if transb == "N" else (n, k)
    for name, rows, op in (("lda", rows_a, f"transa = {transa!r}"), ("ldb", rows_b, f"transb = {transb!r}"),
                           ("ldc", m, "C")):
        if ints[name] < max(1, rows):
            raise ValueError(f"gemm: {name} = {ints[name]} is less than max(1, {rows}), the rows of the stored "
                             f"matrix ({op}, m = {m}, n = {n}, k = {k})")
    dtypes = [numpy.dtype(x.dtype) for x in (a, b, c)]
    if dtypes[0].name not in GEMM_DTYPES:
        raise ValueError(f"gemm: a's dtype {dtypes[0]} is not one of {GEMM_DTYPES}")
    if dtypes[1] != dtypes[0]:
        raise ValueError(f"gemm: b's dtype {dtypes[1]} differs from a's {dtypes[0]}")
    # cuBLAS's table for CUBLAS_COMPUTE_32F also takes 16-bit A and B with a float32 C (a float32 accumulator).
    if dtypes[2] != dtypes[0] and not (dtypes[0].itemsize == 2 and dtypes[2] == numpy.float32):
        raise ValueError(f"gemm: c's dtype {dtypes[2]} differs from a's and b's {dtypes[0]} (cuBLAS takes a float32 "
                         f"c only for float16/bfloat16 inputs)")
    if m and n and batch:
        ranges = {}
        for name, x, rows, cols, ld, stride, used in (
                ("a", a, rows_a, cols_a, ints["lda"], ints["stride_a"], k > 0),
                ("b", b, rows_b, cols_b, ints["ldb"], ints["stride_b"], k > 0),
                ("c", c, m, n, ints["ldc"], ints["stride_c"], True)):
            if not used:
                continue
            last = _last_element(rows, cols, ld, stride, batch)
            available = _elements_from_pointer(x)
            if last >= available:
                raise ValueError(f"gemm: {name} holds {available} elements from its data pointer, but the call "
                                 f"reaches element {last} ({rows}x{cols} matrices, ld{name} = {ld}, stride_{name} = "
                                 f"{stride}, batch = {batch}): an out-of-bounds access on a GPU")
            begin = _address(x)
            ranges[name] = (begin, begin + (last + 1) * x.itemsize)
        if batch > 1 and _batch_overlaps(m, n, ints["ldc"], ints["stride_c"], batch):
            raise ValueError(f"gemm: stride_c = {ints['stride_c']} makes the batch's C matrices overlap "
                             f"({m}x{n}, ldc = {ints['ldc']}): their results would race")
        for name in ("a", "b"):
            if name in ranges and ranges[name][0] < ranges["c"][1] and ranges["c"][0] < ranges[name][1]:
                raise ValueError(f"gemm: c's memory overlaps {name}'s: c must not alias a or b")
    return (m, n, k, ints["lda"], ints["stride_a"], ints["ldb"], ints["stride_b"], ints["ldc"], ints["stride_c"],
            batch)


def _row_major_layout(x):
    """How cuBLAS reads the row-major matrix in x's last two dims (R, C), or None if it cannot in place:
    ('N', ld) when rows are ld elements apart (memory is the column-major C x R matrix x^T), ('T', ld) when
    columns are (memory is x itself, column-major R x C; cuBLAS transposes it)."""
    rows, cols = x.shape[-2:]
    if any(s < 0 or s % x.itemsize for s in x.strides):
        return None
    s_rows, s_cols = (s // x.itemsize for s in x.strides[-2:])
    if (cols == 1 or s_cols == 1) and (rows == 1 or s_rows >= max(1, cols)):
        return "N", (s_rows if rows > 1 else max(1, cols))
    if (rows == 1 or s_rows == 1) and (cols == 1 or s_cols >= max(1, rows)):
        return "T", (s_cols if cols > 1 else max(1, rows))
    return None


def host_memory() -> int | None:
    """Bytes of physical memory of this machine, the most the CPU path can hold (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):   # no sysconf (Windows) or no such name
        return None


def total_memory(device) -> int | None:
    """Bytes of memory the arrays of a path live in: the machine's for the CPU path (device None), else the
    device's."""
    return host_memory() if device is None else device.total_memory()


# "1": CudaDevice runs the 16-bit and TF32 forward on wgmma where ops/wgmma_gemm.py prefers it (9.0 GPUs only):
# off by default until a GPU run has verified conv_fwd_wgmma (`CudaDevice.wgmma`).
WGMMA_ENV = "CUPYCONV_WGMMA"
ARRIVALS_LEAST = 1024   # `Device.arrival_counters`' smallest array (4 KiB): most launches never grow it


class Device:
    """What an op's GPU path needs from an executor."""

    xp = numpy
    name = "abstract"
    tensor_cores = True  # whether mma.sync runs here (sm_80 and newer); the emulator executes it
    # whether the 16-bit and TF32 forward may run on wgmma (ops/wgmma_gemm.py; sm_90a code runs on 9.0 GPUs only):
    # CudaDevice on a 9.0 GPU; the emulator executes it but claims it only where a test sets it
    # (tests/test_wgmma_conv.py), so that every other test keeps the mma.sync kernels it checks
    wgmma = False

    def launch(self, source: str, name: str, grid, block, args, shared_mem: int = 0) -> None:
        """Launch kernel `name` (a name expression) of raw_kernels/`source` on the current stream; args are in
        the C order, of the exact C types (`_kernels.KernelFile.arguments` builds them)."""
        raise NotImplementedError

    def launch_prepare(self, source: str, name: str, grid, block, args, shared_mem: int = 0) -> tuple:
        """(prepared, args) of a `launch` for `launch_run`, which a replay (`_replay`) repeats with other arrays in
        the same places of args: what a launch looks up or converts on every call, done once.  Here nothing:
        the launch as given."""
        return (source, name, tuple(grid), tuple(block), shared_mem), tuple(args)

    def launch_run(self, prepared: tuple, args: tuple) -> None:
        """The `launch_prepare`d launch with these arguments."""
        source, name, grid, block, shared_mem = prepared
        self.launch(source, name, grid, block, args, shared_mem)

    def gemm_strided_batched(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                             ldc, stride_c, batch) -> None:
        """cuBLAS's cublasGemmStridedBatchedEx, column-major: for i < batch,

            C_i = alpha * op(A_i) @ op(B_i) + beta * C_i        op(X) = X ('N') or X^T ('T'), op(A_i) m x k,
                                                                op(B_i) k x n, C_i m x n

        where element (r, col) of X_i (X = A, B, C, stored column-major) is element i * stride_x + r + col * ldx
        of the buffer that starts at array x's data pointer (x's shape and strides only bound that buffer).
        Strides and leading dimensions are in elements; stride_a or stride_b 0 broadcasts one matrix over the
        batch (a shared weight).  a and b have one dtype of GEMM_DTYPES; c has it too, or is float32 for
        float16/bfloat16 inputs.  Accumulation and compute type as `gemm_compute`; alpha and beta are host
        numbers; beta = 0 never reads C (it may hold NaN), beta = 1 accumulates into it.  C is written in place.

        A row-major product out (M, N) = x (M, K) @ y (K, N) is the column-major out^T (N x M) = y^T @ x^T:
        m = N, n = M, k = K, A = y's buffer, B = x's, ldc = out's row stride (`matmul_strided` does this).

        Here: NumPy on the raw buffers (the emulator's GEMM), after the checks `CudaDevice` runs before cuBLAS
        (`gemm_arguments`), so CI sees the very calls and rejections of the GPU.  TF32 is not emulated."""
        m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch = gemm_arguments(
            transa, transb, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch)
        if not (m and n and batch):
            return
        acc = gemm_compute(a.dtype)[1]
        strided = numpy.lib.stride_tricks.as_strided

        def op(x, trans, rows, cols, ld, stride):  # op(X_i) for every i: (batch, rows, cols)
            stored = (rows, cols) if trans == "N" else (cols, rows)
            view = strided(x, (batch, *stored), (stride * x.itemsize, x.itemsize, ld * x.itemsize), writeable=False)
            return (view if trans == "N" else view.transpose(0, 2, 1)).astype(acc)

        result = acc.type(alpha) * numpy.matmul(op(a, transa, m, k, lda, stride_a), op(b, transb, k, n, ldb, stride_b))
        out = strided(c, (batch, m, n), (stride_c * c.itemsize, c.itemsize, ldc * c.itemsize))
        if beta != 0:
            result += acc.type(beta) * out.astype(acc)
        out[...] = result.astype(c.dtype)

    def matmul_strided(self, a, b, out, *, beta=0.0):
        """out = a @ b + beta * out, batched like numpy.matmul, through `gemm_strided_batched`; returns out.

        a (..., M, K) and b (..., K, N): batch dims broadcast to out's (..., M, N) (a missing or size-1 dim is
        read at stride 0, e.g. one weight for every sample); out needs unit stride along N.  Each row-major
        product is cuBLAS's column-major out^T = b^T @ a^T (see `gemm_strided_batched`): an operand that is a
        transposed view is read with 'T' instead of being copied; one with no unit stride in its last two dims
        (or a negative stride) is copied first.  The largest batch dim is cuBLAS's batch, the others are looped
        over (one call for each of their indices).  beta = 1 accumulates into out (out may have a wider dtype,
        float32 for float16/bfloat16 operands)."""
        if min(a.ndim, b.ndim, out.ndim) < 2 or a.shape[-2] != out.shape[-2] or b.shape[-1] != out.shape[-1] \
                or a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul_strided: a {a.shape} @ b {b.shape} does not give out {out.shape}")
        *batch_shape, rows, cols = out.shape
        inner = a.shape[-1]
        if out.size == 0:
            return out
        if (_row_major_layout(out) or ("T",))[0] != "N":
            raise ValueError(f"matmul_strided: out (strides {out.strides}) needs unit stride along its last dim "
                             f"and no negative stride")
        a, b = (x if _row_major_layout(x) else self.ascontiguous(x) for x in (a, b))
        a = self.xp.broadcast_to(a, (*batch_shape, rows, inner))   # views: no copy
        b = self.xp.broadcast_to(b, (*batch_shape, inner, cols))
        if inner == 0:  # an empty sum: BLAS's C = beta * C, without a call
            if beta == 0:
                self.copyto(out, 0)
            return out
        (trans_b, ld_b), (trans_a, ld_a), (_, ld_out) = (_row_major_layout(x) for x in (b, a, out))
        dims = [d for d, size in enumerate(batch_shape) if size > 1]
        batched = max(dims, key=lambda d: batch_shape[d], default=None)
        count = 1 if batched is None else batch_shape[batched]

        def batch_stride(x):
            return 0 if batched is None else x.strides[batched] // x.itemsize

        loops = [range(batch_shape[d]) if d in dims and d != batched else (0,) for d in range(len(batch_shape))]
        for position in itertools.product(*loops):
            index = tuple(slice(None) if d == batched else i for d, i in enumerate(position))
            self.gemm_strided_batched(trans_b, trans_a, cols, rows, inner, 1.0, b[index], ld_b, batch_stride(b),
                                      a[index], ld_a, batch_stride(a), beta, out[index], ld_out, batch_stride(out),
                                      count)
        return out

    # -- array work -----------------------------------------------------------------------------------------
    # Every array operation of the GPU path that is not a view (allocating, copying, filling, converting,
    # summing) goes through these methods, never through xp or the arrays' own methods: CuPy runs each on a
    # kernel of its own, so a test device that keeps real CuPy arrays over host memory (tests/emulator's
    # CupyHostDevice) serves them on that memory.  empty, copyto, add and sum are the primitives; zeros,
    # ascontiguous, astype and reshape are built on them.  Views (slices, transpose, swapaxes, broadcast_to, a
    # reshape that needs no copy) are taken directly.  The CPU path's array work is this class's, on NumPy.

    def empty(self, shape, dtype):
        """A new uninitialised C-contiguous array."""
        return self.xp.empty(shape, dtype=dtype)

    def copyto(self, dst, src) -> None:
        """dst[...] = src: an array broadcast to dst's shape and converted to its dtype, or a number (a fill)."""
        dst[...] = src

    def add(self, dst, src) -> None:
        """dst += src, src an array broadcast to dst's shape."""
        dst += src

    def sum(self, a, axis, dtype):
        """A new array: a summed over axis (an int or a tuple of ints), accumulated and returned in dtype."""
        return a.sum(axis=axis, dtype=dtype)

    def zeros(self, shape, dtype):
        out = self.empty(shape, dtype)
        self.copyto(out, 0)
        return out

    def arrival_counters(self, size: int):
        """An int32 array of at least `size` zeros in which the blocks of one launch count their arrivals
        (common.cuh's `last_arrival`: the tensor-core weight gradient's split-K, finished by the last block of each
        tile, and the depthwise weight and bias gradients' partial rows, by the last block of each channel).  The
        kernels leave every count they take back at 0, so one array per stream (`stream_key`) is made and zeroed
        once and serves every launch on that stream after it: no fill per call, and launches in flight on two
        streams never share a count."""
        kept = self.__dict__.setdefault("_arrivals", {})
        key = self.stream_key()
        counters = kept.get(key)
        if counters is None or counters.size < size:
            counters = kept[key] = self.zeros((max(size, ARRIVALS_LEAST),), numpy.int32)
        return counters

    def stream_key(self):
        """What tells this executor's streams apart (`arrival_counters`): one stream here."""
        return None

    def ascontiguous(self, a):
        """a itself when it is C-contiguous, else a C-contiguous copy."""
        if a.flags.c_contiguous:
            return a
        out = self.empty(a.shape, a.dtype)
        self.copyto(out, a)
        return out

    def astype(self, a, dtype):
        """a itself when it has dtype, else a copy converted to dtype."""
        if a.dtype == dtype:
            return a
        out = self.empty(a.shape, dtype)
        self.copyto(out, a)
        return out

    def reshape(self, a, shape):
        """a.reshape(shape): a view where a's strides allow one, else a reshaped C-contiguous copy (NumPy's and
        CuPy's rule, with the copy made by `ascontiguous`)."""
        view = a.view()
        try:
            view.shape = shape   # raises AttributeError where only a copy can have that shape
        except AttributeError:
            return self.ascontiguous(a).reshape(shape)
        return view

    def total_memory(self) -> int | None:
        """Bytes of memory this executor's arrays live in (None: unknown): here, the emulator's NumPy arrays, the
        machine's physical memory."""
        return host_memory()

    def timed(self, run):
        """(seconds, result) of run(), for autotuning: the wall clock here; on a GPU (`CudaDevice.timed`) the
        GPU's time alone, without the host's."""
        begin = time.perf_counter()
        result = run()
        return time.perf_counter() - begin, result

    def key(self):
        """What identifies this executor in the autotuning cache."""
        return (self.name, id(self))

    def scope(self, op: str, device_id: int):
        """The context one public call's GPU path runs in, for arrays on CUDA device `device_id` (`_arrays.Call`
        enters it): nothing here."""
        return contextlib.nullcontext()


def _cublas():
    """(CuPy's cuBLAS handle for the current device and thread, the cublas bindings)."""
    from cupy.cuda import device as cuda_device
    from cupy_backends.cuda.libs import cublas
    return cuda_device.get_cublas_handle(), cublas


def opt_in_shared_memory(kernel, shared_mem: int) -> None:
    """Let `kernel` launch with `shared_mem` bytes of dynamic shared memory: above 48 KiB a launch fails unless
    the kernel opted in first, by raising its cudaFuncAttributeMaxDynamicSharedMemorySize (the settable
    `max_dynamic_shared_size_bytes` of the RawKernel that `RawModule.get_function` returns).  `CudaDevice.launch`
    calls this before every launch, and so does the test emulator on its model of that attribute, so CI runs this
    very step."""
    if shared_mem > DEFAULT_SHARED_LIMIT and kernel.max_dynamic_shared_size_bytes < shared_mem:
        kernel.max_dynamic_shared_size_bytes = shared_mem


def _cuda_runtime():
    """CuPy's CUDA runtime bindings (the CUDA_R_* data types of cuBLAS's Ex functions)."""
    from cupy_backends.cuda.api import runtime
    return runtime


class CudaDevice(Device):
    """CuPy arrays, NVRTC-compiled RawModules (memoised per device), cuBLAS through CuPy's bindings
    (`gemm_strided_batched`).

    What needs the GPU itself is reached through `function` (the compiled kernel), `cublas` (the handle and
    the bindings), `compute_capability` and the array work (see `Device`): the test suite's CupyHostDevice
    (tests/emulator) overrides those to run everything else of this class on the CPU."""

    name = "cuda"

    def __init__(self):
        import cupy
        self.xp = cupy

    @property
    def compute_capability(self) -> int:
        """The current GPU's compute capability as an int, e.g. 80 for 8.0 (CuPy's Device().compute_capability)."""
        return int(self.xp.cuda.Device().compute_capability)

    @property
    def tensor_cores(self) -> bool:
        return self.compute_capability >= 80

    @property
    def wgmma(self) -> bool:
        # Opt-in (WGMMA_ENV=1) until conv_fwd_wgmma has run on a GPU: an independent review (2026-11-27) found its
        # descriptors, swizzle, instruction and fences as the PTX ISA and CUTLASS have them, but the emulator that
        # checks it was written from the same reading, and a misreading would be a silently wrong result.
        # benchmarks.gpu_check turns it on for its run (the GPU tests of tests/test_wgmma*.py decide).
        return self.compute_capability == 90 and os.environ.get(WGMMA_ENV) == "1"

    def function(self, source: str, name: str):
        """The compiled kernel `name` of raw_kernels/`source` for the current device: the RawKernel that
        `cupy.RawModule.get_function` returns."""
        return _cuda_function(source, name)

    def cublas(self):
        """(handle, cublas, runtime): CuPy's cuBLAS handle for the current device and thread, its cuBLAS binding
        (cupy_backends.cuda.libs.cublas) and its CUDA runtime binding (whose CUDA_R_* name the data types)."""
        handle, cublas = _cublas()
        return handle, cublas, _cuda_runtime()

    def gemm_strided_batched(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                             ldc, stride_c, batch) -> None:
        """`Device.gemm_strided_batched` as one cublasGemmStridedBatchedEx on CuPy's cuBLAS handle and current
        stream, after the same checks (`gemm_arguments`).  Followed, in CuPy v14.2.0:
          cupy_backends/cuda/libs/cublas.pyx, `cpdef gemmStridedBatchedEx(intptr_t handle, int transa,
            int transb, int m, int n, int k, size_t alpha, size_t A, int Atype, int lda, long long strideA,
            size_t B, int Btype, int ldb, long long strideB, size_t beta, size_t C, int Ctype, int ldc,
            long long strideC, int batchCount, int computeType, int algo)`: its first statement, `_setStream(handle)`,
            sets the handle's stream to CuPy's current stream (`stream_module.get_current_stream_ptr()`), as for
            every binding cupy.matmul calls; a computeType >= CUBLAS_COMPUTE_16F goes to the cublasComputeType_t API.
          cupy/_core/_routines_linalg.pyx, `tensordot_core_v11` (what cupy.matmul's 2-D path calls): handle from
            `device.get_cublas_handle()` (per device and thread), alpha/beta as host scalars of the compute
            type's scale type (float for CUBLAS_COMPUTE_32F*, double for CUBLAS_COMPUTE_64F), data types from
            `runtime.CUDA_R_*` (`_dtype.to_cuda_dtype`: bfloat16 by dtype name).
        Host pointer mode is what cuBLAS handles start in and what CuPy keeps outside its cupy.cublas helpers
        (cupy/cublas.py restores the mode it changes); it is checked and restored here all the same.  The
        algorithm is CUBLAS_GEMM_DEFAULT: the deprecated *_TENSOR_OP value would allow CUBLAS_COMPUTE_32F_FAST_16F
        kernels for strict float32.  A strict float32 GEMM also relies on the handle's math mode not being
        CUBLAS_TF32_TENSOR_OP_MATH (CuPy's default, which cupyconv never changes)."""
        prepared = self.gemm_prepare(transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                                     ldc, stride_c, batch)
        if prepared is not None:
            self.gemm_run(prepared, a, b, c)

    def gemm_prepare(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                     stride_c, batch):
        """The checks (`gemm_arguments`) and cuBLAS arguments of a `gemm_strided_batched` call but its pointers,
        for `gemm_run`; None where there is nothing to write.  They hold for any a, b and c of the same shapes,
        strides and dtypes (alignments and overlaps aside), with the same settings on the same device: a replay
        (`_replay`) prepares once at recording and runs the prepared call on each replay's own arrays, without
        the checks' hundred Python calls per GEMM."""
        if not all(isinstance(x, self.xp.ndarray) for x in (a, b, c)):
            raise TypeError(f"gemm: a, b and c must be {self.xp.__name__} arrays")
        m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch = gemm_arguments(
            transa, transb, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch)
        if not (m and n and batch):
            return None   # nothing to write; cuBLAS would return at once
        _, cublas, runtime = self.cublas()
        cuda_type = {"float16": runtime.CUDA_R_16F, "bfloat16": runtime.CUDA_R_16BF, "float32": runtime.CUDA_R_32F,
                     "float64": runtime.CUDA_R_64F}
        compute, scale = gemm_compute(a.dtype)
        if compute == "CUBLAS_COMPUTE_32F_FAST_TF32" and self.compute_capability < 80:
            # No TF32 tensor cores: CuPy's own rule (cupy/_core/_routines_linalg.pyx `set_compute_type`, v14.2.0)
            # falls back to the default compute type below compute capability 8.0.
            compute = "CUBLAS_COMPUTE_32F"
        scalars = numpy.array([alpha, beta], dtype=scale)   # host memory, alive as long as the prepared call
        ops = {"N": cublas.CUBLAS_OP_N, "T": cublas.CUBLAS_OP_T}
        return (scalars, ops[transa], ops[transb], m, n, k, cuda_type[a.dtype.name], lda, stride_a,
                cuda_type[b.dtype.name], ldb, stride_b, cuda_type[c.dtype.name], ldc, stride_c, batch,
                getattr(cublas, compute))

    def gemm_run(self, prepared, a, b, c) -> None:
        """One cublasGemmStridedBatchedEx of a `gemm_prepare`d call on a, b and c (as prepared)."""
        (scalars, op_a, op_b, m, n, k, type_a, lda, stride_a, type_b, ldb, stride_b, type_c, ldc, stride_c, batch,
         compute) = prepared
        handle, cublas, _ = self.cublas()
        mode = cublas.getPointerMode(handle)
        if mode != cublas.CUBLAS_POINTER_MODE_HOST:
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        try:
            cublas.gemmStridedBatchedEx(
                handle, op_a, op_b, m, n, k, scalars.ctypes.data, _address(a), type_a, lda, stride_a,
                _address(b), type_b, ldb, stride_b, scalars.ctypes.data + scalars.itemsize,
                _address(c), type_c, ldc, stride_c, batch, compute, cublas.CUBLAS_GEMM_DEFAULT)
        finally:
            if mode != cublas.CUBLAS_POINTER_MODE_HOST:
                cublas.setPointerMode(handle, mode)

    def launch(self, source, name, grid, block, args, shared_mem=0):
        kernel = self.function(source, name)
        if shared_mem > DEFAULT_SHARED_LIMIT:   # (opt_in_shared_memory's own first test: no call per launch below)
            opt_in_shared_memory(kernel, shared_mem)
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)

    def launch_prepare(self, source, name, grid, block, args, shared_mem=0):
        """The launch as a replay repeats it (`Device.launch_prepare`): the kernel's CuPy `Function` for the current
        device (what `RawKernel.__call__` looks up through `RawKernel.kernel` on every call, after `function`'s
        own lookup), opted in to its shared memory once (the attribute stays set on the function), and its scalar
        arguments wrapped once as CuPy wraps them on every launch (`_packed`).  Followed, in CuPy v14.2.0:
          cupy/_core/raw.pyx, `RawKernel.__call__`: `self.kernel(grid, block, args,
            enable_cooperative_groups=self.enable_cooperative_groups, **kwargs)`, `kernel` the `Function` of the
            current device (`_kernel`: `runtime.getDevice()`, then its per-device cache);
          cupy/cuda/function.pyx, `_launch`: each argument through `_pointer` -- an ndarray as its CArray, a
            `CPointer` as it is, any other scalar as a new `_scalar.CScalar(x)` (its dtype and C value, about half a
            microsecond each on this CPU: 51 per launch of channels_last_copies), then cuLaunchKernel, which copies
            the argument values before it returns.
        The prepared launch holds for the device current now: a replay's program is kept per device (its key
        holds `key()`)."""
        kernel = self.function(source, name)
        if shared_mem > DEFAULT_SHARED_LIMIT:
            opt_in_shared_memory(kernel, shared_mem)
        return (kernel.kernel, tuple(grid), tuple(block), shared_mem), _packed(args)

    def launch_run(self, prepared, args):
        """The prepared launch (`launch_prepare`) on CuPy's current stream: `Function.__call__` as RawKernel's."""
        function, grid, block, shared_mem = prepared
        function(grid, block, args, shared_mem)

    @property
    def clock_rate(self) -> int:
        """The current GPU's SM clock in Hz (cudaDevAttrClockRate: the peak clock, so a spin of N cycles lasts at
        least N / clock_rate seconds): what `_autotune.spin` converts seconds to clock64() cycles with."""
        return _cuda_clock_rate(self.xp.cuda.Device().id)

    def timed(self, run):
        """(seconds, result) of run(): the GPU's time alone for run()'s work, however long the host takes to
        enqueue it (`_autotune.gpu_time`: CUDA events on the current stream behind a spin kernel)."""
        from . import _autotune   # (it imports this module through _kernels)
        return _autotune.gpu_time(self, run)

    def key(self):
        return ("cuda", self.xp.cuda.Device().id)

    def stream_key(self):
        """(device, stream handle) of CuPy's current stream: each stream counts in its own array."""
        return (self.xp.cuda.Device().id, self.xp.cuda.get_current_stream().ptr)

    def scope(self, op: str, device_id: int):
        """The arrays' device as CuPy's current device (kernels are memoised per device, outputs and workspaces are
        allocated on it, cuBLAS handles are per device), and a refusal while the current stream captures a CUDA
        graph (`refuse_stream_capture`)."""
        return _CudaScope(self.xp.cuda.Device(device_id), op)

    def total_memory(self) -> int:
        return _cuda_total_memory(self.xp.cuda.Device().id)


#: The Python scalar types CuPy's launch wraps in a `CScalar` (cupy/cuda/function.pyx `_pointer`'s last case)
_SCALARS = (numpy.generic, bool, int, float, complex)


@functools.lru_cache(maxsize=None)
def _scalar_wrapper():
    """CuPy's kernel-argument wrapper of a scalar, `cupy._core._scalar.CScalar` (a `CPointer`, which a launch
    passes on as it is), or None where this CuPy has none (its launches then wrap the scalars themselves)."""
    try:
        from cupy._core._scalar import CScalar
        from cupy.cuda.function import CPointer
        probe = CScalar(numpy.int32(-7))   # CuPy 14's constructor: (value, dtype=None), the value's own dtype
        usable = isinstance(probe, CPointer) and probe.get_numpy_type() is numpy.int32 and probe.value == -7
    except (ImportError, TypeError, AttributeError):
        return None
    return CScalar if usable else None


def _packed(args) -> tuple:
    """args with each scalar wrapped once as CuPy's launch would wrap it on every call (`CudaDevice.launch_prepare`):
    the same value, C type and bytes; arrays, None and anything else as they are."""
    wrap = _scalar_wrapper()
    if wrap is None:
        return tuple(args)
    return tuple(wrap(a) if isinstance(a, _SCALARS) else a for a in args)


class _CudaScope:
    """`CudaDevice.scope` as a plain context manager: entered on every GPU call, the repeated ones included, where
    contextlib's generator machinery was a third of the fast path's own Python calls."""
    __slots__ = ("device", "op")

    def __init__(self, device, op: str):
        self.device, self.op = device, op

    def __enter__(self):
        self.device.__enter__()
        try:
            refuse_stream_capture(self.op)
        except BaseException:
            self.device.__exit__(*sys.exc_info())
            raise

    def __exit__(self, *exc):
        return self.device.__exit__(*exc)


CAPTURE_REFUSAL = (
    "cupyconv cannot run while the current CUDA stream captures a graph (torch.cuda.graph, CUDA graph trees, "
    "cupy.cuda.Stream.begin_capture): CuPy 14's cuBLAS binding raises during capture and autotuning synchronises. "
    "Run cupyconv outside the captured region; with torch.compile, mode='reduce-overhead' runs cupyconv's ops "
    "outside its CUDA graphs (they are tagged cudagraph_unsafe; torch >= 2.8), or use mode='default' or "
    "'max-autotune-no-cudagraphs'")


def stream_capturing() -> bool:
    """Whether CuPy's current stream is capturing a CUDA graph (CuPy 14: `cupy.cuda.runtime.streamIsCapturing`).
    The query itself fails where launching would break a capture: on the legacy default stream while another
    stream captures in global mode (cudaErrorStreamCaptureImplicit), or on a stream whose capture an error
    invalidated (CuPy raises RuntimeError): both count as capturing."""
    import cupy
    runtime = cupy.cuda.runtime
    try:
        return bool(runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr))
    except runtime.CUDARuntimeError as error:
        if error.status == 906:   # cudaErrorStreamCaptureImplicit (CuPy has no name for it)
            return True
        raise
    except RuntimeError as error:
        if "capture" in str(error):   # "the stream was capturing, but an error has invalidated the capture ..."
            return True
        raise


def refuse_stream_capture(op: str) -> None:
    """RuntimeError naming `op` and what to use instead while the current stream captures (`stream_capturing`):
    every GEMM would raise inside CuPy's cuBLAS binding (cupy_backends/cuda/libs/cublas.pyx `setStream`, v14.2.0)
    and autotuning would synchronise, so no call is half captured."""
    if stream_capturing():
        raise RuntimeError(f"{op}: {CAPTURE_REFUSAL}")


def _cuda_major(version: int) -> int:
    return version // 1000


@functools.lru_cache(maxsize=None)
def check_cupy_toolkit() -> None:
    """RuntimeError unless the NVRTC and the CUDA headers CuPy compiles with are of CuPy's own CUDA major release.

    CuPy 14 finds both through cuda-pathfinder (cupy_backends/cuda/libs/_cnvrtc.pxi, `load_nvidia_dynamic_lib`;
    cupy/_core/core.pyx, `find_nvidia_header_directory('cudart')`), which looks in site-packages' nvidia/cu13 first:
    CUDA 13 wheels installed next to cupy-cuda12x (cupyconv's `compile-check` extra) become its NVRTC and headers,
    and the kernels would be built for a driver the machine may not have.  Checked once, before the first compile."""
    import cupy
    built = _cuda_major(cupy.cuda.runtime.runtimeGetVersion())
    nvrtc = cupy.cuda.nvrtc.getVersion()
    headers = _cuda_header_version(_cupy_header_dir())
    found = [f"NVRTC {nvrtc[0]}.{nvrtc[1]}"] if nvrtc[0] != built else []
    if headers is not None and _cuda_major(headers) != built:
        found.append(f"CUDA {_cuda_major(headers)} headers in {_cupy_header_dir()}")
    if found:
        raise RuntimeError(
            f"cupyconv: CuPy {cupy.__version__} is built for CUDA {built} but would compile the kernels with "
            f"{' and '.join(found)}: toolkit wheels of another CUDA release in this environment (e.g. from "
            f"cupyconv's compile-check extra) shadow CuPy's own.  Uninstall them, or install cupyconv[cuda{built}] "
            f"in an environment without them")


def _cupy_header_dir() -> str | None:
    """The CUDA include directory CuPy 14 passes to NVRTC (core.pyx `assemble_cupy_compiler_options`)."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:   # an older CuPy without cuda-pathfinder: it finds its toolkit its own way
        return None
    return find_nvidia_header_directory("cudart")


def _cuda_header_version(include_dir: str | None) -> int | None:
    """CUDART_VERSION (e.g. 12090) of the headers in include_dir, None when there are none."""
    if include_dir is None:
        return None
    try:
        text = (Path(include_dir) / "cuda_runtime_api.h").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"^#define\s+CUDART_VERSION\s+(\d+)", text, re.M)
    return int(match.group(1)) if match else None


@functools.lru_cache(maxsize=None)
def _cuda_total_memory(device_id: int) -> int:
    """Bytes of global memory of a GPU (a device property: read once)."""
    return _cuda_runtime().getDeviceProperties(device_id)["totalGlobalMem"]


@functools.lru_cache(maxsize=None)
def _cuda_clock_rate(device_id: int) -> int:
    """A GPU's peak SM clock in Hz (a device attribute, in kHz: read once)."""
    runtime = _cuda_runtime()
    return runtime.deviceGetAttribute(runtime.cudaDevAttrClockRate, device_id) * 1000


@functools.lru_cache(maxsize=None)
def _cuda_function_on(device_id: int, source: str, name: str):
    import cupy
    check_cupy_toolkit()
    capability = int(cupy.cuda.Device(device_id).compute_capability)
    module = cupy.RawModule(code=kernel_source(source), options=compile_options(source, capability),
                            name_expressions=(name,))
    return module.get_function(name)


def _cuda_function(source: str, name: str):
    """The compiled kernel for the current CUDA device (modules are per device; CuPy caches binaries on disk)."""
    import cupy
    return _cuda_function_on(cupy.cuda.Device().id, source, name)


_forced_device: contextvars.ContextVar = contextvars.ContextVar("cupyconv_forced_device", default=None)


@contextlib.contextmanager
def use_device(device: Device):
    """Route the arrays of `device.xp` through `device` (used by the tests): NumPy arrays through the emulator's
    GPU path instead of the CPU path, CuPy arrays through a test device instead of `CudaDevice`."""
    token = _forced_device.set(device)
    try:
        yield device
    finally:
        _forced_device.reset(token)


def executor_for(xp):
    """None for the NumPy CPU path, else the Device that runs the GPU path for arrays of module xp."""
    forced = _forced_device.get()
    if forced is not None and forced.xp is xp:
        return forced
    return None if xp is numpy else CudaDevice()
