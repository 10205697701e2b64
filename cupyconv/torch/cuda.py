"""CUDA tensors: CuPy's work on torch's current stream, with memory from torch's caching allocator."""
import contextlib
import contextvars

import torch


class _StreamHandle:
    """A torch stream's handle and device, through the CUDA stream protocol too, which
    `cupy.cuda.Stream.from_external` reads."""
    __slots__ = ("cuda_stream", "device_index")

    def __init__(self, cuda_stream: int, device_index: int):
        self.cuda_stream, self.device_index = cuda_stream, device_index

    def __cuda_stream__(self):
        return (0, self.cuda_stream)


def _cupy_stream(cupy, stream: _StreamHandle):
    """A CuPy stream object over torch's stream `stream` (must be created with its device current)."""
    if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, stream.device_index)


def _torch_allocator(cupy, stream: int):
    """A CuPy allocator drawing from torch's caching allocator, stream-ordered on the stream of handle `stream`."""

    def malloc(size, device_id):
        return torch.cuda.caching_allocator_alloc(size, device_id, stream)

    def free(ptr, device_id):
        torch.cuda.caching_allocator_delete(ptr)

    return cupy.cuda.PythonFunctionAllocator(malloc, free).malloc


#: The torch device type whose tensors run CuPy's kernels here (benchmarks.host_overhead --torch sets it to "cpu" to
#: take CPU tensors down this path with the driver calls faked).
DEVICE_TYPE = "cuda"

# torch's current stream of a device as its handle: one C call where torch has it (torch._C's, which torch.compile's
# generated code calls too), else through torch.cuda.current_stream, several Python calls.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# (device index, stream handle) of the innermost cuda_context: a nested one for the same device and stream (the
# plain function a custom op calls enters it again for its torch tensors) has nothing left to set up.
_active: contextvars.ContextVar = contextvars.ContextVar("cupyconv_torch_cuda_context", default=None)

#: {(device index, stream handle): (the CuPy stream object over that stream, the CuPy allocator over torch's caching
#: allocator ordered on it)}, made on a context's first entry for that stream and reused: making them again on every
#: call was a measurable part of a call's host time.  Neither holds per-call state (CuPy keeps its current stream and
#: allocator per thread), so threads share them; a handle torch reuses for a new stream is that stream's.
_PER_STREAM: dict = {}
_PER_STREAM_LIMIT = 64


class _CudaContext:
    """`cuda_context` for a CUDA device: torch's current device (for an index of None) and stream are read when the
    block is entered, as the generator it replaces did."""
    __slots__ = ("index", "token", "entered")

    def __init__(self, index):
        self.index, self.entered = index, None

    def __enter__(self):
        import cupy
        index = self.index if self.index is not None else torch.cuda.current_device()
        stream_handle = _raw_stream(index) if _raw_stream is not None else _current_stream(index)
        key = (index, stream_handle)
        if _active.get() == key:
            return None
        device = cupy.cuda.Device(index)   # (a new one each time: CuPy's Device keeps its enter stack per object)
        device.__enter__()
        try:
            try:
                stream, allocator = _PER_STREAM[key]
            except KeyError:   # made with the device current, as CuPy's stream object needs
                if len(_PER_STREAM) >= _PER_STREAM_LIMIT:
                    _PER_STREAM.clear()
                stream, allocator = _PER_STREAM[key] = (_cupy_stream(cupy, _StreamHandle(stream_handle, index)),
                                                        _torch_allocator(cupy, stream_handle))
            allocation = cupy.cuda.using_allocator(allocator)
            allocation.__enter__()
            try:
                stream.__enter__()
            except BaseException:
                allocation.__exit__(None, None, None)
                raise
        except BaseException:
            device.__exit__(None, None, None)
            raise
        self.entered = (stream, allocation, device)
        self.token = _active.set(key)
        return None

    def __exit__(self, *exc):
        if self.entered is None:
            return False
        stream, allocation, device = self.entered
        self.entered = None
        try:
            stream.__exit__(*exc)
        finally:
            try:
                allocation.__exit__(*exc)
            finally:
                try:
                    device.__exit__(*exc)
                finally:
                    _active.reset(self.token)
        return False


_NOTHING = contextlib.nullcontext()


def cuda_context(device):
    """Run the CuPy work inside on torch's terms for `device` (a torch.device, or a tensor on it).

    For a CUDA device: that device is CuPy's current device, torch's current stream is CuPy's current stream
    (so every kernel and cuBLAS call is ordered with torch's work, and DLPack hand-overs need no
    synchronisation), and CuPy allocates from torch's caching allocator on that stream (so memory is reused
    stream-safely and counted by `torch.cuda.memory_allocated`).  For any other device it does nothing.

    Memory that outlives the block (results handed to torch) stays owned by the stream that was current when
    it was allocated; use it on another stream only after synchronising, as for any torch tensor.
    """
    if isinstance(device, torch.Tensor):
        device = device.device
    elif type(device) is not torch.device:
        device = torch.device(device)
    if device.type != DEVICE_TYPE:
        return _NOTHING
    return _CudaContext(device.index)   # (no index: torch's current device when the block is entered)


def _run(fn, like, *args, memory_format=torch.contiguous_format, **kwargs):
    """fn(*args, **kwargs) in `like`'s device context; tensor results made contiguous in `memory_format`, as the
    fake ops promise (a result already so is not copied).  fn (a plain cupyconv function) refuses devices it has
    no path for, naming the op and the argument."""
    with cuda_context(like.device):
        result = fn(*args, **kwargs)
        if isinstance(result, tuple):
            return tuple(r if r is None else r.contiguous(memory_format=memory_format) for r in result)
        return result.contiguous(memory_format=memory_format)
