"""EmulatedDevice: the GPU path's Device on NumPy buffers, running raw_kernels/ compiled for the CPU."""
from __future__ import annotations

import ctypes
import operator
import os
import threading
from pathlib import Path

import numpy

from cupyconv import _device as cupyconv_device
from cupyconv._kernels import argument_error

from ._asan import asan_preloaded
from ._build import DYNAMIC_SHARED_CAPACITY, build
from ._profile import LaunchProfile, name_places, read_sites

STATIC_SHARED_LIMIT = cupyconv_device.DEFAULT_SHARED_LIMIT  # static + dynamic without opt-in (every architecture)
OPT_IN_SHARED_LIMIT = DYNAMIC_SHARED_CAPACITY  # sm_90's opt-in maximum per block (sm_80: 163 KiB)
# The emulated SM clock: clock64() counts the host's monotonic nanoseconds (include/prelude.h).
EMULATED_CLOCK_HZ = 1_000_000_000


class EmulatorError(RuntimeError):
    """Base class of the emulator's errors."""


class KernelArgumentError(EmulatorError, TypeError):
    """An argument does not match the kernel's C signature."""


class LaunchConfigError(EmulatorError, ValueError):
    """A grid, block or shared memory size that CUDA would refuse."""


class KernelFailure(EmulatorError):
    """The kernel misbehaved while running: divergent barrier, deadlock, misuse of a warp operation."""


_C_NAMES = {"f2": "__half", "bf2": "__nv_bfloat16", "f4": "float", "f8": "double", "b1": "bool",
            "i1": "signed char", "i2": "short", "i4": "int", "i8": "long long",
            "u1": "unsigned char", "u2": "unsigned short", "u4": "unsigned int", "u8": "unsigned long long"}

def _c_name(code: str) -> str:
    if code.startswith("pc"):
        return f"const {_c_name(code[2:])}*"
    if code.startswith("p"):
        return f"{_c_name(code[1:])}*"
    return _C_NAMES.get(code, "<a type the emulator cannot pass>")


def _dtype_code(dtype) -> str | None:
    dtype = numpy.dtype(dtype)
    if dtype.name == "bfloat16":  # ml_dtypes.bfloat16, as CuPy uses
        return "bf2"
    if dtype.kind == "b":
        return "b1"
    if dtype.kind in "fiu":
        return f"{dtype.kind}{dtype.itemsize}"
    return None


def _describe(value) -> str:
    if isinstance(value, numpy.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    if isinstance(value, numpy.generic):
        return f"numpy.{type(value).__name__}"
    return f"a Python {type(value).__name__}"


def _span(a: numpy.ndarray) -> tuple[int, int]:
    """Byte offsets, relative to a's data pointer, of the first and one past the last byte a can reach."""
    if a.size == 0:
        return 0, 0
    low = high = 0
    for n, s in zip(a.shape, a.strides):
        if s < 0:
            low += s * (n - 1)
        else:
            high += s * (n - 1)
    return low, high + a.itemsize


def _dims(value, what: str) -> tuple[int, int, int]:
    dims = (value,) if not isinstance(value, (tuple, list)) else tuple(value)
    try:
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise LaunchConfigError(f"{what} must be an int or a tuple of 1 to 3 ints, not {value!r}") from None
    if not 1 <= len(dims) <= 3:
        raise LaunchConfigError(f"{what} must have 1 to 3 dimensions, not {value!r}")
    if min(dims) < 1:
        raise LaunchConfigError(f"{what} {dims} has an empty dimension (CUDA: invalid configuration argument)")
    return dims + (1,) * (3 - len(dims))


def _check_config(grid, block) -> None:
    threads = block[0] * block[1] * block[2]
    if threads > 1024:
        raise LaunchConfigError(f"block {block} has {threads} threads; CUDA allows at most 1024 per block")
    for d, (size, limit) in zip("xyz", zip(block, (1024, 1024, 64))):
        if size > limit:
            raise LaunchConfigError(f"block.{d} = {size} exceeds CUDA's limit of {limit}")
    for d, (size, limit) in zip("xyz", zip(grid, (2**31 - 1, 65535, 65535))):
        if size > limit:
            raise LaunchConfigError(f"grid.{d} = {size} exceeds CUDA's limit of {limit}")


class _Kernel:
    """One compiled kernel, with the attributes of CuPy's RawKernel that launches depend on:
    max_threads_per_block, shared_size_bytes (static shared memory) and max_dynamic_shared_size_bytes."""

    def __init__(self, library: "_Library", index: int, name: str):
        lib = library.cdll
        self.library = library
        self.name = name
        self.launch = getattr(lib, f"emu_launch_{index}")
        self.launch.restype = ctypes.c_int
        self.launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p,
                                ctypes.c_void_p]
        getattr(lib, f"emu_signature_{index}").restype = ctypes.c_char_p
        getattr(lib, f"emu_max_threads_{index}").restype = ctypes.c_longlong
        # The kernel's __launch_bounds__ (0: none), as g++ evaluated it with the file's -D options.
        self.launch_bound = getattr(lib, f"emu_max_threads_{index}")()
        text = getattr(lib, f"emu_signature_{index}")().decode()
        self.codes = text.split(",")[:-1] if text else []
        # Every __shared__ variable the kernel reaches, its helpers' included (_build.static_shared_sizes).
        self.shared_size_bytes = library.static_shared.get(name, 0)
        self.max_threads_per_block = self.launch_bound or 1024
        # cudaFuncAttributeMaxDynamicSharedMemorySize starts at what 48 KiB leave beside the static memory; a
        # launch that asks for more fails unless the device raised it (cupyconv._device.opt_in_shared_memory).
        self._max_dynamic_shared = max(0, STATIC_SHARED_LIMIT - self.shared_size_bytes)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._max_dynamic_shared

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        # cudaFuncSetAttribute refuses a value that, with the static memory, exceeds the device's opt-in maximum.
        value = operator.index(value)
        if not 0 <= value <= OPT_IN_SHARED_LIMIT - self.shared_size_bytes:
            raise LaunchConfigError(
                f"{self.library.source}: {self.name}: max_dynamic_shared_size_bytes = {value} is refused: with its "
                f"{self.shared_size_bytes} bytes of static shared memory a block may have {OPT_IN_SHARED_LIMIT} "
                f"(cudaDevAttrMaxSharedMemoryPerBlockOptin of sm_90)")
        self._max_dynamic_shared = value


class _Library:
    def __init__(self, path: Path, meta: dict):
        self.path = path
        self.cdll = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self.cdll.emu_error.restype = ctypes.c_char_p
        self.cdll.emu_set_order.argtypes = [ctypes.c_int]
        self.cdll.emu_set_blocks.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
        self.profiled = hasattr(self.cdll, "emu_profile_begin")
        if self.profiled:
            self.cdll.emu_profile_begin.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
            guards = [v for g in meta.get("tls_guards", []) for v in g]
            self.guards = (ctypes.c_ulonglong * max(len(guards), 1))(*guards)
            self.cdll.emu_profile_blocks.restype = ctypes.c_longlong
            self.cdll.emu_profile_site.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.names = list(meta["names"])
        self.source = meta["source"]
        self.static_shared = meta["static_shared"]
        self._index = {n: i for i, n in enumerate(self.names)}
        self._kernels = {}

    def __contains__(self, name):
        return name in self._index

    def kernel(self, name: str) -> _Kernel:
        if name not in self._kernels:
            self._kernels[name] = _Kernel(self, self._index[name], name)
        return self._kernels[name]


# (kernel dir, source, asan, counters, part: EmulatedDevice._part) -> _Library, shared by every EmulatedDevice
_LIBRARIES: dict = {}
_LOCK = threading.RLock()  # the engine's state is global: one launch at a time


class EmulatedDevice(cupyconv_device.Device):
    """Runs the GPU path on NumPy arrays: the unmodified CUDA source, compiled by g++, on CPU fibers.

    order:      "forward" or "reverse": the order in which the threads of a block (and the blocks of the grid)
                take turns.  A kernel missing a __syncthreads() goes wrong in at least one of the two.
    asan:       run the AddressSanitizer build (global and dynamic shared memory under ASan, static shared
                arrays under -fsanitize=bounds).  Needs libasan preloaded: see run_under_asan/pytest_under_asan.
                Default: on when the environment sets CUPYCONV_EMULATOR_ASAN=1 (those helpers do).
    kernel_dir: another directory of kernels (the emulator's self-tests); default: cupyconv's raw_kernels/.
    instantiations: (file, name expression) pairs to compile for kernel_dir, one library per file; default for
                raw_kernels/: cupyconv._device.all_instantiations(), and launching any other name raises.
    blocks:     None (every block), or a function of a launch's grid (x, y, z) that returns the blocks to run,
                as (x, y, z) triples, e.g. `last_block` or `spread_blocks(k)`: gridDim stays the whole grid, so those
                blocks compute the indices they would on a GPU, while the others are skipped (problems of 2^31
                elements and more).
    counters:   run the profile build (a separate library, not with asan) and append a LaunchProfile of every
                launch's memory counters (per access site: warp requests, global sectors and lines, shared
                wavefronts) to `self.profile`; see emulator.profile_report and tests/emulator/README.md.
    """

    name = "emulated"
    xp = numpy
    clock_rate = EMULATED_CLOCK_HZ   # Hz of clock64(), as CudaDevice.clock_rate

    def __init__(self, order: str = "forward", *, asan: bool | None = None, kernel_dir=None, instantiations=None,
                 blocks=None, counters: bool = False):
        if order not in ("forward", "reverse"):
            raise ValueError(f"order must be 'forward' or 'reverse', not {order!r}")
        self.order = order
        self.asan = os.environ.get("CUPYCONV_EMULATOR_ASAN") == "1" if asan is None else bool(asan)
        if self.asan and not asan_preloaded():
            raise EmulatorError("the ASan emulator needs libasan preloaded into the interpreter: run the code "
                                "through tests/emulator's run_under_asan() or pytest_under_asan()")
        package_dir = cupyconv_device.kernel_dir().resolve()
        self.kernel_dir = Path(kernel_dir).resolve() if kernel_dir is not None else package_dir
        self._package = self.kernel_dir == package_dir
        self._instantiations = None if instantiations is None else sorted(set(instantiations))
        self.blocks = blocks
        self.counters = bool(counters)
        if self.counters and self.asan:
            raise EmulatorError("counters=True runs the profile build, which cannot be the ASan build (asan=False)")
        self.profile: list[LaunchProfile] = []

    def __repr__(self):
        return (f"EmulatedDevice(order={self.order!r}, asan={self.asan}, counters={self.counters}, "
                f"kernel_dir='{self.kernel_dir}')")

    # -- Device interface -------------------------------------------------------------------------------

    def empty(self, shape, dtype):
        """Uninitialised like cupy.empty, but poisoned: every byte 0xFF (NaN for every float type)."""
        out = numpy.empty(shape, dtype=dtype)
        out.reshape(-1).view(numpy.uint8)[...] = 0xFF
        return out

    def launch(self, source, name, grid, block, args, shared_mem=0):
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        _check_config(grid, block)
        shared_mem = operator.index(shared_mem)
        if shared_mem < 0:
            raise LaunchConfigError(f"shared_mem = {shared_mem} is negative")
        kernel = self.function(source, name)
        threads = block[0] * block[1] * block[2]
        if threads > kernel.max_threads_per_block:
            # The kernel was compiled for at most that many threads (registers); a GPU refuses the launch.
            raise LaunchConfigError(f"{source}: {name} is declared __launch_bounds__({kernel.launch_bound}) but is "
                                    f"launched with block {block}, {threads} threads")
        # The step CudaDevice.launch takes before every launch, on this kernel's model of the attribute; looked up
        # in the module at each call, so that a test can take it away and see the launch fail.
        cupyconv_device.opt_in_shared_memory(kernel, shared_mem)
        self._check_shared(source, kernel, shared_mem)
        argv, extents, keep_alive = self._marshal(source, kernel, list(args))
        grid_c = (ctypes.c_uint * 3)(*grid)
        block_c = (ctypes.c_uint * 3)(*block)
        chosen = None
        if self.blocks is not None:
            linear = []
            for x, y, z in self.blocks(grid):
                if not (0 <= x < grid[0] and 0 <= y < grid[1] and 0 <= z < grid[2]):
                    raise LaunchConfigError(f"block ({x}, {y}, {z}) is outside the grid {grid}")
                linear.append(x + grid[0] * (y + grid[1] * z))
            chosen = (ctypes.c_ulonglong * max(len(linear), 1))(*linear)
        with _LOCK:
            library = kernel.library
            library.cdll.emu_set_order(self.order == "reverse")
            if chosen is not None:
                library.cdll.emu_set_blocks(ctypes.addressof(chosen), len(linear))
            if self.counters:
                spans = _global_spans(list(args))
                library.cdll.emu_profile_begin(ctypes.addressof(spans), len(spans) // 3,
                                               ctypes.addressof(library.guards), len(library.guards) // 2)
            try:
                status = kernel.launch(grid_c, block_c, shared_mem, argv, extents)
            finally:
                if chosen is not None:
                    library.cdll.emu_set_blocks(None, -1)
                if self.counters:
                    library.cdll.emu_profile_end()
            message = library.cdll.emu_error().decode(errors="replace") if status else ""
            message = name_places(message, library.path, self.kernel_dir) if "@pc:" in message else message
            if self.counters and not status:
                self.profile.append(LaunchProfile(source, name, grid, block, shared_mem,
                                                  library.cdll.emu_profile_blocks(),
                                                  read_sites(library.cdll, library.path, self.kernel_dir)))
        del keep_alive
        if status:
            raise KernelFailure(f"{source}: {name}, grid {grid}, block {block}, {self.order} order: {message}")

    # -- helpers --------------------------------------------------------------------------------------------

    def library_path(self, source: str) -> Path:
        """Where the compiled library for `source` is (compiling it if needed)."""
        return self._library_for(source, required=None).path

    def _names_for(self, source: str, part: str | None = None) -> list[str]:
        pairs = cupyconv_device.all_instantiations() if self._instantiations is None else self._instantiations
        names = sorted({n for f, n in pairs if f == source})
        if part is not None:
            names = [n for n in names if (", long long" in n) == (part == "long long")]
        return names

    def _part(self, required: str | None) -> str | None:
        """An ASan or profile (counters) build of a cupyconv kernel file is two libraries, of its 32-bit-index
        instantiations ("int") and of their 64-bit twins ("long long"), each compiled when a launch first needs it:
        most ASan and counter runs launch the former only, and g++ under ASan takes ~75 s of CI's cores for
        depthwise.cu's whole file (the profile build of implicit_gemm.cu, which tests/test_counters.py makes, held
        71 twins no counter test launches).  The plain builds hold every instantiation in one library: the emulator
        tests launch both index types of every file."""
        if not ((self.asan or self.counters) and self._package):
            return None
        return "long long" if required is not None and ", long long" in required else "int"

    def _library_for(self, source: str, required: str | None = None) -> _Library:
        part = self._part(required)
        key = (str(self.kernel_dir), source, self.asan, self.counters, part)
        with _LOCK:
            library = _LIBRARIES.get(key)
            if library is not None and (required is None or required in library):
                return library
            names = self._names_for(source, part)
            if required is not None and required not in names:
                if self._package:
                    raise EmulatorError(
                        f"{source}: {required} is launched but missing from its op's instantiations(), so the "
                        f"NVRTC check never compiles it; list it there (instantiations: {names})")
                names = sorted(set(names) | set(library.names if library else ()) | {required})
            if not names:
                raise EmulatorError(f"{source}: no instantiations to compile")
            path, meta = build(self.kernel_dir, source, names, self.asan, self._defines(source), profile=self.counters)
            library = _LIBRARIES[key] = _Library(path, meta)
            return library

    def _defines(self, source: str) -> tuple[str, ...]:
        """The -D options of the file's shared constants (cupyconv's own kernels; none for the self-tests)."""
        kernels = cupyconv_device.kernel_files().get(source) if self._package else None
        return kernels.options() if kernels else ()

    def function(self, source: str, name: str) -> _Kernel:
        """The compiled kernel `name` of `source`, as CuPy's RawModule.get_function gives it on a GPU: its
        attributes persist between launches (an opt-in stays) and are shared by every EmulatedDevice."""
        return self._library_for(source, required=name).kernel(name)

    def _check_shared(self, source, kernel: _Kernel, dynamic: int) -> None:
        static = kernel.shared_size_bytes
        if static > STATIC_SHARED_LIMIT:  # ptxas refuses to compile it
            raise LaunchConfigError(f"{source}: {kernel.name} declares {static} bytes of static shared memory; "
                                    f"CUDA allows {STATIC_SHARED_LIMIT}")
        if dynamic > kernel.max_dynamic_shared_size_bytes:
            raise LaunchConfigError(
                f"{source}: {kernel.name} asks for {dynamic} bytes of dynamic shared memory beside its {static} "
                f"static bytes ({static + dynamic} in all), more than its max_dynamic_shared_size_bytes of "
                f"{kernel.max_dynamic_shared_size_bytes}: above {STATIC_SHARED_LIMIT} in all a GPU launches it only "
                f"after the opt-in (cupyconv._device.opt_in_shared_memory), and never above {OPT_IN_SHARED_LIMIT}")

    def _marshal(self, source, kernel: _Kernel, args: list):
        codes = kernel.codes
        where = f"{source}: {kernel.name}"
        if len(args) != len(codes):
            raise KernelArgumentError(f"{where} takes {len(codes)} arguments "
                                      f"({', '.join(_c_name(c) for c in codes)}), got {len(args)}")
        slots, extents = [], []
        for i, (value, code) in enumerate(zip(args, codes)):
            if "?" in code:
                raise KernelArgumentError(f"{where}: parameter {i} has a type the emulator cannot pass")
            # The same check as cupyconv's KernelFile.launch, here against the signature the compiler saw.
            error = argument_error(_c_name(code), value)
            if error:
                raise KernelArgumentError(f"{where}: argument {i} is {_describe(value)} but parameter {i} is "
                                          f"`{_c_name(code)}`: {error}")
            if code.startswith("p"):
                slots.append(ctypes.c_void_p(value.ctypes.data))
                extents += _span(value)
            else:
                slots.append(ctypes.create_string_buffer(value.tobytes(), 8))
                extents += (0, 0)
        argv = (ctypes.c_void_p * max(len(slots), 1))(*[ctypes.addressof(s) for s in slots])
        extents_c = (ctypes.c_longlong * max(len(extents), 2))(*extents)
        return argv, extents_c, slots


def _global_spans(args: list):
    """(low, high, allocation start) of every array argument, flat, for emu_profile_begin: the bytes its pointer
    reaches and where the memory it views begins (the outermost NumPy array whose buffer it shares), so that
    sectors count from an allocation's start as on a GPU, whose allocations are 256-byte aligned."""
    values = []
    for a in args:
        if isinstance(a, numpy.ndarray):
            low, high = _span(a)
            root = a
            while isinstance(root.base, numpy.ndarray):
                root = root.base
            data = a.ctypes.data
            values += [data + low, data + high, min(root.ctypes.data, data + low)]
    return (ctypes.c_ulonglong * max(len(values), 1))(*values)


def spread_blocks(count: int):
    """The `blocks` of an EmulatedDevice that runs `count` blocks of every grid, spread evenly over its linear
    index from the first to the last (all of them when the grid has no more): a sample for the counters."""
    def blocks(grid):
        total = grid[0] * grid[1] * grid[2]
        chosen = sorted({round(i * (total - 1) / max(count - 1, 1)) for i in range(min(count, total))})
        return [(b % grid[0], b // grid[0] % grid[1], b // (grid[0] * grid[1])) for b in chosen]
    return blocks


def last_block(grid):
    """The `blocks` of an EmulatedDevice that runs only the last block of every grid (the highest indices)."""
    return [(grid[0] - 1, grid[1] - 1, grid[2] - 1)]


class EmulatedCublas:
    """The part of CuPy's bindings that `CudaDevice.gemm_strided_batched` calls, on host memory, so that its
    exact call runs in CI: `CupyHostDevice.cublas` returns (this.get_cublas_handle(), this, this); for other
    devices monkeypatch `cupyconv._device._cublas` to return (this.get_cublas_handle(), this) and
    `_device._cuda_runtime` to return this too (it carries runtime's CUDA_R_* data types).

    Names, constants and the positional signature are CuPy v14.2.0's (cupy_backends/cuda/libs/cublas.pxd and
    .pyx, cupy_backends/cuda/api/_runtime_enum.pxd).  `gemmStridedBatchedEx` takes what the Cython wrapper takes
    (Python ints; `int` parameters in the C int range, the handle an `intptr_t`, pointers as non-negative ints,
    here host addresses; `SIGNATURE` is the one CuPy's compiled module embeds, which tests/test_cupy_arrays.py
    reads from the installed wheel),
    rejects a data/compute type combination outside cuBLAS's table, reads alpha and beta from host memory as
    the compute type's scale type, computes with `Device.gemm_strided_batched` on the memory the pointers
    address, and records every call in `gemms` (with the math and pointer modes at the time)."""

    CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
    CUBLAS_POINTER_MODE_HOST, CUBLAS_POINTER_MODE_DEVICE = 0, 1
    CUBLAS_DEFAULT_MATH, CUBLAS_TENSOR_OP_MATH, CUBLAS_TF32_TENSOR_OP_MATH = 0, 1, 3
    CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT_TENSOR_OP = -1, 99
    CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_64F = 68, 77, 70
    CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14

    SIGNATURE = ("gemmStridedBatchedEx(intptr_t handle, int transa, int transb, int m, int n, int k, size_t alpha, "
                 "size_t A, int Atype, int lda, long long strideA, size_t B, int Btype, int ldb, long long strideB, "
                 "size_t beta, size_t C, int Ctype, int ldc, long long strideC, int batchCount, int computeType, "
                 "int algo)")
    HANDLE = 0x7EA  # what get_cublas_handle returns: an intptr_t, as CuPy's (cupy.cuda.device.get_cublas_handle)

    _TYPES = {0: numpy.dtype(numpy.float32), 1: numpy.dtype(numpy.float64), 2: numpy.dtype(numpy.float16)}
    # (compute type) -> (scale type, {A/B type: allowed C types}), from cuBLAS's cublasGemmEx table
    _TABLE = {68: (numpy.float32, {0: {0}, 2: {2, 0}, 14: {14, 0}}), 77: (numpy.float32, {0: {0}}),
              70: (numpy.float64, {1: {1}})}

    def __init__(self):
        self.mode, self.pointer_mode, self.gemms = 0, 0, []

    def get_cublas_handle(self):
        return self.HANDLE

    def getMathMode(self, handle):
        return self.mode

    def setMathMode(self, handle, mode):
        self.mode = mode

    def getPointerMode(self, handle):
        return self.pointer_mode

    def setPointerMode(self, handle, mode):
        self.pointer_mode = mode

    @classmethod
    def _dtype(cls, code):
        if code == cls.CUDA_R_16BF:
            import ml_dtypes
            return numpy.dtype(ml_dtypes.bfloat16)
        return cls._TYPES[code]

    def gemmStridedBatchedEx(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                             strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
        if type(handle) is not int or not -2**63 <= handle < 2**63:
            raise TypeError(f"gemmStridedBatchedEx: handle = {handle!r} is not an intptr_t")
        ints = dict(transa=transa, transb=transb, m=m, n=n, k=k, Atype=Atype, lda=lda, Btype=Btype, ldb=ldb,
                    Ctype=Ctype, ldc=ldc, batchCount=batchCount, computeType=computeType, algo=algo)
        for name, value in ints.items():
            if type(value) is not int or not -2**31 <= value < 2**31:
                raise TypeError(f"gemmStridedBatchedEx: {name} = {value!r} is not a C int")
        for name, value in dict(strideA=strideA, strideB=strideB, strideC=strideC).items():
            if type(value) is not int or not -2**63 <= value < 2**63:
                raise TypeError(f"gemmStridedBatchedEx: {name} = {value!r} is not a long long")
        for name, value in dict(alpha=alpha, A=A, beta=beta, B=B, C=C).items():
            if type(value) is not int or not 0 < value < 2**64:
                raise TypeError(f"gemmStridedBatchedEx: {name} = {value!r} is not a pointer")
        if transa not in (0, 1) or transb not in (0, 1) or algo != self.CUBLAS_GEMM_DEFAULT:
            raise ValueError(f"gemmStridedBatchedEx: transa {transa}, transb {transb}, algo {algo}")
        if computeType not in self._TABLE or Atype != Btype or Ctype not in self._TABLE[computeType][1].get(Atype, ()):
            raise ValueError(f"CUBLAS_STATUS_NOT_SUPPORTED: Atype {Atype}, Btype {Btype}, Ctype {Ctype} with "
                             f"computeType {computeType}")
        scale = numpy.dtype(self._TABLE[computeType][0])
        read = lambda address: numpy.frombuffer((ctypes.c_char * scale.itemsize).from_address(address), scale)[0]
        self.gemms.append(dict(computeType=computeType, math_mode=self.mode, pointer_mode=self.pointer_mode,
                               alpha=read(alpha), beta=read(beta)))
        if self.pointer_mode != self.CUBLAS_POINTER_MODE_HOST:
            raise ValueError("alpha and beta are host pointers but the handle is in device pointer mode")
        op = "NT"

        def buffer(address, code, rows, cols, ld, stride):  # the memory the call may touch, as a 1-D array
            dtype = self._dtype(code)
            count = (batchCount - 1) * stride + (cols - 1) * ld + rows if rows and cols and batchCount else 1
            return numpy.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(address), dtype)

        a = buffer(A, Atype, *((m, k) if transa == 0 else (k, m)), lda, strideA)
        b = buffer(B, Btype, *((k, n) if transb == 0 else (n, k)), ldb, strideB)
        c = buffer(C, Ctype, m, n, ldc, strideC)
        cupyconv_device.Device().gemm_strided_batched(op[transa], op[transb], m, n, k, float(read(alpha)), a, lda,
                                                      strideA, b, ldb, strideB, float(read(beta)), c, ldc, strideC,
                                                      batchCount)
