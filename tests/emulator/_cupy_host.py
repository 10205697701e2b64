"""CupyHostDevice: cupyconv's CudaDevice on real CuPy arrays over host memory, its kernels run by the emulator.

CuPy 14 builds `cupy.ndarray` objects over any memory without a driver (`cupy.cuda.UnownedMemory` +
`MemoryPointer`), and its views (slices, transpose, swapaxes, broadcast_to, a reshape that needs no copy) work
on them too; what needs a driver is allocating, CuPy's own kernels (copies, fills, arithmetic, reductions), the
compiled RawKernels, cuBLAS and the device's properties.  This device keeps everything of `CudaDevice` but those:

- memory: `empty` allocates host memory (poisoned with 0xFF, 256-byte aligned like CuPy's pool) and returns a
  real cupy.ndarray over it; the array work of `Device` (`copyto`, `add`, `sum`, hence `zeros`, `ascontiguous`,
  `astype`, `reshape`) runs in NumPy on views of the same memory (`host`).
- launching: `CudaDevice.launch` itself runs; `function` gives it a kernel with CuPy's RawKernel interface whose
  call takes the very (grid, block, args) tuple a RawKernel gets, turns each CuPy array into a NumPy view of its
  memory and hands the launch to an `EmulatedDevice`.
- cuBLAS: `CudaDevice.gemm_strided_batched` itself runs, against `EmulatedCublas`, the twin of CuPy's binding.
- device properties: compute capability 9.0 (the emulator models sm_90), the machine's memory, the emulator's
  1 GHz clock64() (`clock_rate`), the wall clock for `timed`.

Any CuPy call in the GPU path that is not routed through the Device fails here with CuPy's own
CUDARuntimeError ("CUDA driver version is insufficient"), so a test through this device finds it.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import weakref

import numpy

from cupyconv import _device as cupyconv_device

from ._device import EMULATED_CLOCK_HZ, EmulatedCublas, EmulatedDevice, _span

ALIGNMENT = 256   # CuPy's memory pool hands out 256-byte aligned blocks

#: The host buffers behind the arrays of every CupyHostDevice, by address: `host` reads only memory listed here.
_BUFFERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class _HostKernel:
    """A compiled kernel as `CudaDevice.launch` uses CuPy's RawKernel: its `max_dynamic_shared_size_bytes`
    (the emulated kernel's), a call with RawKernel's signature, `kernel(grid, block, args, *, shared_mem=0)`, and
    its `kernel`, the per-device `Function` a prepared launch calls (`CudaDevice.launch_prepare`)."""

    def __init__(self, device: "CupyHostDevice", source: str, name: str):
        self.device, self.source, self.name = device, source, name
        self.emulated = device.emulator.function(source, name)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self.emulated.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self.emulated.max_dynamic_shared_size_bytes = value

    @property
    def kernel(self) -> "_HostFunction":
        return _HostFunction(self)

    def __call__(self, grid, block, args, *, shared_mem=0):
        # RawKernel.__call__ hands grid and block to Function.__call__, which declares them `tuple`; args is
        # iterated as a tuple, each element a cupy.ndarray (passed as its data pointer) or a scalar: a bool,
        # int, float, complex or NumPy scalar (CuPy raises TypeError("Unsupported type ...") for anything else,
        # NumPy arrays included).
        self.launch(grid, block, args, shared_mem)

    def launch(self, grid, block, args, shared_mem, wrapped=False):
        """The launch; wrapped: args may hold scalars already wrapped as CuPy's launch wraps them (a `CScalar`,
        which `Function.__call__` passes on as it is), unwrapped here to their value of their dtype."""
        for what, value in (("grid", grid), ("block", block), ("args", args)):
            if type(value) is not tuple:
                raise TypeError(f"RawKernel {self.name}: {what} must be a tuple, not {type(value).__name__}")
        converted = []
        for value in args:
            if isinstance(value, self.device.xp.ndarray):
                converted.append(self.device.host(value))
            elif isinstance(value, (bool, int, float, complex, numpy.generic)):
                converted.append(value)
            elif wrapped and type(value) is cupyconv_device._scalar_wrapper():
                converted.append(value.get_numpy_type()(value.value))
            else:
                raise TypeError(f"RawKernel {self.name}: Unsupported type {type(value)}")
        self.device.launches.append(self.name)
        self.device.emulator.launch(self.source, self.name, grid, block, converted, shared_mem)


class _HostFunction:
    """CuPy's `Function` (what `RawKernel.kernel` returns) of a `_HostKernel`: its call,
    `function(grid, block, args, shared_mem=0, stream=None)`, takes wrapped scalars (`CScalar`) too."""

    def __init__(self, kernel: _HostKernel):
        self.raw = kernel

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        if stream is not None:
            raise TypeError("cupyconv launches on CuPy's current stream (stream=None)")
        self.raw.launch(grid, block, args, shared_mem, wrapped=True)


class CupyHostDevice(cupyconv_device.CudaDevice):
    """`cupyconv._device.CudaDevice` with real CuPy arrays over host memory and its kernels on the emulator.

        device = CupyHostDevice()                  # order=, asan= as EmulatedDevice's
        x, w = device.asarray(x_numpy), device.asarray(w_numpy)     # cupy.ndarray over host memory
        with cupyconv._device.use_device(device):  # CuPy arrays now run through this device
            y = cupyconv.conv2d(x, w)               # a cupy.ndarray over host memory
        device.asnumpy(y)                           # a NumPy copy

    `launches` lists the name expressions launched, `blas` is the cuBLAS twin (its `gemms` the calls made).
    """

    name = "cupy-host"
    compute_capability = 90   # the emulator's rules are sm_90's (shared memory opt-in, mma.sync)
    clock_rate = EMULATED_CLOCK_HZ   # clock64() of the emulator: the host's nanoseconds

    def __init__(self, order: str = "forward", *, asan: bool | None = None):
        super().__init__()
        self.emulator = EmulatedDevice(order, asan=asan)
        self.blas = EmulatedCublas()
        self.launches: list[str] = []
        self.scopes: list[tuple[str, int]] = []

    def __repr__(self):
        return f"CupyHostDevice(order={self.emulator.order!r}, asan={self.emulator.asan})"

    # -- CuPy arrays over host memory ---------------------------------------------------------------------

    def empty(self, shape, dtype):
        """A cupy.ndarray over new host memory, every byte 0xFF (NaN for every float type)."""
        cupy = self.xp
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = numpy.dtype(dtype)
        nbytes = max(math.prod(shape) * dtype.itemsize, 1)
        buffer = numpy.full(nbytes + ALIGNMENT, 0xFF, numpy.uint8)
        start = -buffer.ctypes.data % ALIGNMENT
        block = buffer[start:start + nbytes]
        _BUFFERS[block.ctypes.data] = block
        memory = cupy.cuda.UnownedMemory(block.ctypes.data, nbytes, block, device_id=0)
        return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))

    def asarray(self, a):
        """A cupy.ndarray over host memory holding a copy of NumPy array a (C-contiguous)."""
        a = numpy.asarray(a)
        out = self.empty(a.shape, a.dtype)
        self.host(out)[...] = a
        return out

    def asnumpy(self, a):
        """A NumPy copy of a cupy.ndarray of this device (what cupy.asnumpy would give)."""
        return self.host(a).copy()

    def host(self, a):
        """The NumPy view of the host memory behind cupy.ndarray a: same shape, strides and first byte."""
        if not isinstance(a, self.xp.ndarray):
            raise TypeError(f"{self!r}: expected a cupy.ndarray, got {type(a).__module__}.{type(a).__name__} (a "
                            f"NumPy array on the GPU path is a host array where a device array belongs)")
        if a.size == 0:
            return numpy.empty(a.shape, a.dtype)
        memory = a.data.mem
        owner = _BUFFERS.get(memory.ptr)
        low, high = _span(a)
        if owner is None or owner.nbytes != memory.size:
            raise ValueError(f"{self!r}: a cupy.ndarray {a.shape} that no CupyHostDevice allocated (real device "
                             f"memory?)")
        if not (memory.ptr <= a.data.ptr + low and a.data.ptr + high <= memory.ptr + memory.size):
            raise ValueError(f"{self!r}: a cupy.ndarray {a.shape} with strides {a.strides} reaches outside its memory")
        window = (ctypes.c_char * (high - low)).from_address(a.data.ptr + low)
        return numpy.ndarray(a.shape, a.dtype, buffer=window, offset=-low, strides=a.strides)

    def _source(self, value):
        """An operand of the array work: a cupy.ndarray as its host view, a number as it is."""
        if isinstance(value, (bool, int, float, numpy.generic)):
            return value
        return self.host(value)

    def copyto(self, dst, src) -> None:
        self.host(dst)[...] = self._source(src)

    def add(self, dst, src) -> None:
        view = self.host(dst)
        view += self._source(src)

    def sum(self, a, axis, dtype):
        total = self.host(a).sum(axis=axis, dtype=dtype)
        out = self.empty(total.shape, total.dtype)
        self.host(out)[...] = total
        return out

    # -- kernels, cuBLAS, properties -------------------------------------------------------------------

    def function(self, source, name):
        return _HostKernel(self, source, name)

    def cublas(self):
        return self.blas.get_cublas_handle(), self.blas, self.blas

    def total_memory(self):
        return cupyconv_device.host_memory()

    @contextlib.contextmanager
    def scope(self, op, device_id):
        """Records (op, device id) instead of entering CuPy's Device context and querying stream capture, which need
        a driver (CudaDevice.scope is tested with recorded fakes in tests/test_gpu_context.py)."""
        self.scopes.append((op, device_id))
        yield

    def timed(self, run):
        return cupyconv_device.Device.timed(self, run)   # the wall clock: CUDA events need a driver

    def key(self):
        return (self.name, id(self))

    def stream_key(self):
        return None   # one stream (CuPy's current stream needs a driver); CudaDevice.stream_key: tests/test_gpu_context.py
