"""Array kinds (NumPy, CuPy, torch), DLPack bridging and dtype rules.

A public call wraps its array arguments in a `Call`: it checks that they are of one kind, on one device, of
one supported dtype, bridges torch tensors to NumPy/CuPy without a copy, picks the executor (the NumPy CPU
path or a kernel Device) and wraps results back into the caller's kind.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy

from . import _device, _fastpath, _replay

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: The array arguments that may be None (absent); every other one given to a `Call` must be an array.
OPTIONAL = frozenset({"bias"})

#: The torch devices the plain functions compute on (the CPU path and the CUDA kernels).
TORCH_DEVICES = ("cpu", "cuda")

#: The plain functions with a differentiable twin of the same name in cupyconv.torch.
TORCH_TWINS = frozenset({"conv1d", "conv2d", "conv3d", "depthwise_conv2d", "patch_conv2d", "conv_transpose1d",
                         "conv_transpose2d", "conv_transpose3d", "unfold", "fold"})


F = TypeVar("F", bound=Callable[..., Any])

# The exit stack of the innermost `on_arrays_device` call: where a `Call` enters its GPU context.
_call_scope: contextvars.ContextVar = contextvars.ContextVar("cupyconv_call_scope", default=None)


def on_arrays_device(fn: F) -> F:
    """Decorator of a public entry point that builds a `Call`: the GPU context that the `Call` enters once it has
    checked its arrays (their device as CuPy's current device; for torch CUDA tensors also torch's current stream
    and caching allocator; the stream-capture refusal) lasts until fn returns or raises."""

    @functools.wraps(fn)
    def in_scope(*args, **kwargs):
        # A repeated call on CuPy arrays: its remembered outcome, the checks skipped (`_fastpath`).
        key = _fastpath.signature(fn, args, kwargs)
        if key is not None:
            result = _fastpath.lookup(key, args, kwargs)
            if result is not _fastpath.MISS:
                return result
        outer = _replay.NOTE.get()
        if outer is not None:   # a public call inside another's slow path: the outer one is more than one pass
            outer.scopes.append(None)
        note = None if key is None else _fastpath.Note()
        with contextlib.ExitStack() as stack:
            token, note_token = _call_scope.set(stack), _replay.NOTE.set(note)
            try:
                result = fn(*args, **kwargs)
            finally:
                _replay.NOTE.reset(note_token)
                _call_scope.reset(token)
        if note is not None:
            _fastpath.remember(key, note, args, kwargs, result)
        return result

    return in_scope  # type: ignore[return-value]


def _kind(a) -> str:
    if isinstance(a, numpy.ndarray):
        return "numpy"
    module = type(a).__module__
    if module.startswith("cupy"):
        return "cupy"
    if module.startswith("torch") and "torch" in sys.modules and isinstance(a, sys.modules["torch"].Tensor):
        return "torch"
    return "other"


def _describe(a) -> str:
    kind = _kind(a)
    if kind == "numpy":
        return "a numpy.ndarray"
    if kind == "cupy":
        return f"a cupy.ndarray on cuda:{a.device.id}"
    if kind == "torch":
        return f"a torch.Tensor on {a.device}"
    return f"a {type(a).__module__}.{type(a).__qualname__}"


def _device_of(a, kind: str | None = None) -> str:
    """'cpu' or 'cuda:<id>'; `kind`: a's `_kind` where the caller knows it already."""
    kind = kind or _kind(a)
    if kind == "cupy":
        return f"cuda:{a.device.id}"
    if kind == "torch":
        return "cpu" if a.device.type == "cpu" else f"cuda:{a.device.index or 0}"
    return "cpu"


def _torch_refusal(a) -> str | None:
    """Why the plain functions cannot compute on torch tensor `a` (a device or layout they have no path for), or
    None when they can."""
    if a.device.type not in TORCH_DEVICES:
        if a.device.type == "meta":
            return ("meta tensors have no data to compute on; cupyconv.torch's ops take them (their fake "
                    "implementations give the output's shape)")
        return f"the plain cupyconv functions compute on {' and '.join(TORCH_DEVICES)} tensors only"
    if a.layout != sys.modules["torch"].strided:
        return f"its layout is {a.layout}; cupyconv takes dense (torch.strided) tensors only"
    return None


def _autograd_refusal(op: str, arrays: dict) -> str | None:
    """Why the plain function `op` refuses these torch tensors: one requires grad while grad mode is on, and the
    plain functions are not recorded by autograd (the result would silently have no grad_fn).  None otherwise.

    Refused rather than routed to cupyconv.torch: the plain functions keep one meaning for every array kind
    (cupyconv.torch's ops differ in torch's conventions: unbatched inputs, channels-last outputs), most of them
    (the N-d and 1-D/3-D depthwise and patch ops, every `*_backward`) have no differentiable twin, and the
    custom ops of cupyconv.torch call them with grad mode off."""
    torch = sys.modules["torch"]
    if not torch.is_grad_enabled():
        return None
    needing = [name for name, a in arrays.items() if a.requires_grad]
    if not needing:
        return None
    use = f"cupyconv.torch.{op}" if op in TORCH_TWINS else "cupyconv.torch's ops and layers"
    return (f"{op}: {', '.join(needing)} requires grad, but the plain cupyconv functions are not recorded by "
            f"autograd (the result would have no gradient); use {use}, or call inside torch.no_grad() or on "
            f"detached tensors for a result without gradient")


# {dtype: its name} of the NumPy, CuPy and torch dtypes seen: NumPy's `dtype.name` and str(dtype) are Python
# properties that cost microseconds a call, paid per array on every public call before this cache.
_DTYPE_NAMES: dict = {}


def _dtype_name(a) -> str:
    dtype = a.dtype
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        return name
    except TypeError:   # an unhashable dtype of some other library: no caching
        return str(dtype).replace("torch.", "")


_DTYPE_NAMES_NUMPY: dict = {}


def dtype_name(dtype) -> str:
    """numpy.dtype(dtype).name, memoised (the kernel launches ask it for every argument)."""
    try:
        return _DTYPE_NAMES_NUMPY[dtype]
    except KeyError:
        name = _DTYPE_NAMES_NUMPY[dtype] = numpy.dtype(dtype).name
        return name


@functools.lru_cache(maxsize=None)
def compute_dtype(dtype):
    """The dtype arithmetic is carried out in: float32 for the half types, else the dtype itself."""
    return numpy.dtype(numpy.float32) if numpy.dtype(dtype).itemsize == 2 else numpy.dtype(dtype)


class Call:
    """The array arguments of one public call, bridged to NumPy or CuPy.

    Arrays are given by keyword (`None` for an absent optional one) and are afterwards available as attributes
    of the same name, as NumPy or CuPy arrays.  `device` is None for the NumPy CPU path, or the kernel Device.
    """

    if TYPE_CHECKING:  # the arrays are attributes named at run time: tell the type checker they exist
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, op: str, **arrays):
        self.op = op
        for name, a in arrays.items():
            if a is None and name not in OPTIONAL:
                raise TypeError(f"{op}: {name} must be a numpy.ndarray, cupy.ndarray or torch.Tensor, got None")
        present = {name: a for name, a in arrays.items() if a is not None}
        # One pass in the arguments' order (so that the first problem found is the one reported), each array's
        # kind and device found once.
        first_name, first = next(iter(present.items()))
        first_facts = None
        for name, a in present.items():
            kind = _kind(a)
            if kind == "other":
                raise TypeError(f"{op}: {name} must be a numpy.ndarray, cupy.ndarray or torch.Tensor, "
                                f"got {_describe(a)}")
            refusal = _torch_refusal(a) if kind == "torch" else None
            if refusal:
                raise TypeError(f"{op}: {name} {tuple(a.shape)} is {_describe(a)}: {refusal}")
            facts = (kind, _device_of(a, kind))
            if first_facts is None:
                first_facts = facts
            elif facts != first_facts:
                raise TypeError(f"{op}: {first_name} is {_describe(first)} but {name} is {_describe(a)}; "
                                f"all arrays of one call must be of one kind on one device")
        first_dtype = _dtype_name(first)
        for name, a in present.items():
            dtype = _dtype_name(a)
            if dtype not in SUPPORTED_DTYPES:
                raise TypeError(f"{op}: {name} has dtype {dtype}; supported dtypes are "
                                f"{', '.join(SUPPORTED_DTYPES)}")
            if dtype != first_dtype:
                raise TypeError(f"{op}: {first_name} has dtype {first_dtype} but {name} has dtype "
                                f"{dtype}; all arrays of one call must have one dtype")
        self.kind, device = first_facts   # type: ignore[misc]
        refusal = _autograd_refusal(op, present) if self.kind == "torch" else None
        if refusal:
            raise TypeError(refusal)
        self._torch_dtype = first.dtype if self.kind == "torch" else None
        self.xp = numpy
        self.bridge: TorchBridge | None = None
        if device != "cpu":   # CuPy arrays, torch CUDA tensors
            import cupy
            self.xp = cupy
            _fastpath.use_cupy(cupy)
            if self.kind == "torch":
                self.bridge = TorchBridge(first.device, first.dtype, cupy)
        self.device = _device.executor_for(self.xp)
        self._enter_gpu_context(first, device)
        for name, a in arrays.items():
            setattr(self, name, None if a is None else self._import(a))
        self.dtype = getattr(self, first_name).dtype

    def _enter_gpu_context(self, first, device: str) -> None:
        """Enter the context the GPU path runs in, for the call's lifetime (`on_arrays_device`), before any array is
        imported: for torch CUDA tensors `cupyconv.torch.cuda_context` (torch's device, current stream and caching
        allocator: outputs are torch memory ordered on torch's stream, as in `cupyconv.torch`); then the executor's
        own scope (`Device.scope`: the arrays' device, the refusal under stream capture)."""
        stack = _call_scope.get()
        if stack is None or self.device is None or self.xp is numpy:
            return
        if self.bridge is not None:
            stack.enter_context(self.bridge.context())
        device_id = int(device.split(":")[1])
        stack.enter_context(self.device.scope(self.op, device_id))
        _fastpath.noted_scope(self.device, self.op, device_id, self.bridge)

    def _import(self, a):
        if self.kind == "numpy":
            # A subclass (numpy.matrix stays 2-D under reshape and indexing) is computed on as its plain ndarray
            # view, and the result is a plain ndarray.
            return a if type(a) is numpy.ndarray else a.view(numpy.ndarray)
        if self.kind != "torch":
            return a
        if self.bridge is not None:   # a CUDA tensor
            array = self.bridge.to_array(a)
            _fastpath.noted_import(a, array)
            return array
        import torch
        t = a.detach().resolve_neg().resolve_conj()   # (see TorchBridge.to_array)
        if t.dtype == torch.bfloat16:
            # NumPy has no bfloat16: compute from a float32 copy and round the result back in `wrap`.
            t = t.float()
        return numpy.from_dlpack(t)

    def wrap(self, result):
        """Return result (an array, None, or a tuple of those) in the kind the caller passed in."""
        if self.kind != "torch":
            return result
        out = self._to_torch(result)
        if self.bridge is not None:
            _fastpath.noted_wrap(result, out)
        return out

    def _to_torch(self, result):
        if isinstance(result, tuple):
            return tuple(self._to_torch(r) for r in result)
        if result is None:
            return None
        if self.bridge is not None:
            return self.bridge.to_tensor(result)
        import torch
        out = torch.from_dlpack(result)
        return out if out.dtype == self._torch_dtype else out.to(self._torch_dtype)


class TorchBridge:
    """The torch side of a GPU call on torch CUDA tensors of one device and dtype: the context its CuPy work runs in
    (`cupyconv.torch.cuda_context`: torch's device, current stream and caching allocator), the tensors' import as
    CuPy arrays and the results' export as tensors (DLPack, no copy).  `Call` uses one; so does a repeat of the
    call on the fast path (`_fastpath`), whose entry keeps it (it holds no tensor)."""
    __slots__ = ("device", "dtype", "cupy", "torch", "cuda_context")

    def __init__(self, device, dtype, cupy):
        from .torch.cuda import cuda_context
        self.device, self.dtype, self.cupy = device, dtype, cupy
        self.torch, self.cuda_context = sys.modules["torch"], cuda_context

    def context(self):
        return self.cuda_context(self.device)

    def to_array(self, t):
        # DLPack has no negative or conjugate bit: numpy/cupy.from_dlpack would read a lazily negated view (e.g.
        # the imaginary part of a conjugated tensor) without its sign.  resolve_* copy such a view, else no-ops.
        return self.cupy.from_dlpack(t.detach().resolve_neg().resolve_conj())

    def to_tensor(self, array):
        out = self.torch.from_dlpack(array)
        return out if out.dtype == self.dtype else out.to(self.dtype)
