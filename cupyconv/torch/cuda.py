"""CUDA tensors: CuPy's work on torch's current stream, with memory from torch's caching allocator."""
import contextlib
import contextvars

import torch


class _StreamProtocol:
    """A torch stream through the CUDA stream protocol, which `cupy.cuda.Stream.from_external` reads."""

    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream.cuda_stream)


def _cupy_stream(cupy, stream):
    """A CuPy stream object over torch `stream` (must be created with its device current)."""
    if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
        return cupy.cuda.Stream.from_external(_StreamProtocol(stream))
    return cupy.cuda.ExternalStream(stream.cuda_stream, stream.device_index)


def _torch_allocator(cupy, stream):
    """A CuPy allocator drawing from torch's caching allocator, stream-ordered on `stream`."""

    def malloc(size, device_id):
        return torch.cuda.caching_allocator_alloc(size, device_id, stream)

    def free(ptr, device_id):
        torch.cuda.caching_allocator_delete(ptr)

    return cupy.cuda.PythonFunctionAllocator(malloc, free).malloc


#: The torch device type whose tensors run CuPy's kernels here (benchmarks.host_overhead --torch sets it to "cpu" to
#: take CPU tensors down this path with the driver calls faked).
DEVICE_TYPE = "cuda"

# (device index, stream handle) of the innermost cuda_context: a nested one for the same device and stream (the
# plain function a custom op calls enters it again for its torch tensors) has nothing left to set up, and setting
# up an allocator and a stream object again is a measurable part of a call's host time.
_active: contextvars.ContextVar = contextvars.ContextVar("cupyconv_torch_cuda_context", default=None)


@contextlib.contextmanager
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
    device = torch.device(device)
    if device.type != DEVICE_TYPE:
        yield
        return
    import cupy
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index)
    key = (index, stream.cuda_stream)
    if _active.get() == key:
        yield
        return
    token = _active.set(key)
    try:
        with cupy.cuda.Device(index), cupy.cuda.using_allocator(_torch_allocator(cupy, stream)), \
                _cupy_stream(cupy, stream):
            yield
    finally:
        _active.reset(token)


def _run(fn, like, *args, memory_format=torch.contiguous_format, **kwargs):
    """fn(*args, **kwargs) in `like`'s device context; tensor results made contiguous in `memory_format`, as the
    fake ops promise (a result already so is not copied).  fn (a plain cupyconv function) refuses devices it has
    no path for, naming the op and the argument."""
    with cuda_context(like.device):
        result = fn(*args, **kwargs)
        if isinstance(result, tuple):
            return tuple(r if r is None else r.contiguous(memory_format=memory_format) for r in result)
        return result.contiguous(memory_format=memory_format)
