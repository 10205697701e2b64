"""A repeated public call on CuPy arrays skips its checks: the validated outcome of a signature seen before.

Measured on the second GPU run (H200, 2026-11-26): with launches replayed (`_replay`), a repeated r50-64 fp16
forward still took 139 us of host time for 47 us of kernel, about half of it above the drivers -- `Call` (kinds,
devices, dtypes), the `ConvSpec` parsing and the argument checks, all redone on every call although their outcome
depends on nothing but the call's signature: its function, its arguments' values (strides, padding, groups,
algorithm, ...), its arrays' shapes, strides, dtypes, devices and pointer alignments, the settings in force and
the executor (`_device.use_device`).

So `_arrays.on_arrays_device` looks the signature up here first (`lookup`).  A hit runs the recorded `Program`
of the call's one `_replay.replayed` call directly on the call's own arrays, inside the executor's GPU scope
(`Device.scope`: the arrays' device current, the stream-capture refusal), exactly as the slow path would.  A
miss runs the slow path with a `Note` open, and `remember` keeps the signature's entry only when that call
SUCCEEDED and was simple enough to repeat without its glue: one GPU scope entered, one `replayed` call whose
arrays are the public call's own array arguments (by identity, each once) and whose result is the public
call's result (no work before or after it: a second pass, another public call made inside it; an op with work
around its drivers -- conv_transpose's extended input and bias -- puts all of it in one program with
`lift.one_program`).  Bad input
therefore never reaches an entry: it fails in the slow path, with its error, every time.

CuPy arrays take the fast path (their exact type, `cupy.ndarray`), with hashable plain arguments (ints, floats,
bools, strings, None, NumPy scalars, tuples and frozensets of those); so do torch CUDA tensors (exact
`torch.Tensor` or `torch.nn.Parameter`: cupyconv.torch's custom ops call the plain functions with them), keyed by
their shape, stride, dtype, device, alignment and requires_grad without a DLPack import; a repeat enters
`cuda_context` and the scope, imports them and exports the results as `Call` does (`_arrays.TorchBridge`, kept by
the entry).  A tensor that requires grad while grad mode is on (which the slow path refuses) or a lazily negated
view (which it copies) goes the slow way.  NumPy arrays (the CPU path), CPU tensors (remembered never: they enter
no GPU scope) and dask arrays always take the slow path, as does a signature whose program is not in the replay
cache (not recordable, autotuned on its first call, the cache emptied, `CUPYCONV_REPLAY=0`).
"""
from __future__ import annotations

import sys

import numpy

from . import _device, _replay, settings

#: Entries by call signature (see `signature`).
CACHE: dict = {}
CACHE_LIMIT = 4096   # signatures kept; past it the cache starts over (an entry is a few hundred bytes)

# The types whose values are hashed as they are (with their type: 1, 1.0 and True are one key to a dict)
_VALUES = frozenset({int, float, bool, str, type(None), frozenset, numpy.int32, numpy.int64, numpy.float32,
                     numpy.float64, numpy.bool_})

#: cupy.ndarray, set when a public call first imports CuPy (`use_cupy`): until then no array takes the fast path.
_ndarray: type | None = None


def use_cupy(cupy) -> None:
    global _ndarray
    _ndarray = cupy.ndarray


#: torch.Tensor and torch.nn.Parameter (exact types: a subclass may compute otherwise), set when a public call first
#: gets a torch tensor (`use_torch`): until then no tensor takes the fast path.
_tensors: frozenset = frozenset()
_grad_enabled = None


def use_torch(torch) -> None:
    global _tensors, _grad_enabled
    _tensors, _grad_enabled = frozenset({torch.Tensor, torch.nn.Parameter}), torch.is_grad_enabled


def signature(fn, args, kwargs):
    """What the slow path's outcome depends on, as a hashable tuple; None where an argument is of a kind the fast
    path does not take (a NumPy array, a torch tensor, a list, ...)."""
    parts = [fn, _device._forced_device.get(), settings.snapshot()]
    append = parts.append
    for a in (*args, *kwargs.values()) if kwargs else args:
        t = type(a)
        if t is _ndarray:
            append(_replay.signature(a))
        elif t in _tensors:
            # What the slow path's import and checks read, without a DLPack import: a tensor that requires grad with
            # grad mode on (refused by the slow path) or a lazily negated view (copied by it) goes the slow way.
            if a.requires_grad and _grad_enabled() or a.is_neg():
                return None
            try:
                append((a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % _replay.ALIGNMENT, a.requires_grad))
            except RuntimeError:   # no strides or no storage (sparse, nested): the slow path says what it takes
                return None
        elif t in _VALUES:
            parts += (t, a)
        elif t is tuple:
            value = _value(a)
            if value is None:
                return None
            append(value)
        else:
            if _ndarray is None and t.__module__.startswith("cupy") and "cupy" in sys.modules:
                use_cupy(sys.modules["cupy"])   # CuPy's first array: from now on its arrays are known
                return signature(fn, args, kwargs)
            if not _tensors and t.__module__.startswith("torch") and "torch" in sys.modules:
                use_torch(sys.modules["torch"])   # torch's first tensor: likewise
                return signature(fn, args, kwargs)
            return None
    if kwargs:
        append(tuple(kwargs))   # the names, in order
    return tuple(parts)


def _value(a: tuple):
    """A tuple argument with its elements' types, or None if one is not a plain value."""
    out: list = [tuple]
    for e in a:
        t = type(e)
        if t in _VALUES:
            out += (t, e)
        elif t is tuple:
            value = _value(e)
            if value is None:
                return None
            out.append(value)
        else:
            return None
    return tuple(out)


class Entry:
    """How to repeat a remembered call: the executor and its scope's arguments, where each input array of its
    program is among the call's arguments (None: an absent array), and the program with the replay cache and
    generation it was found in (looked up once: the replay key holds the spec, slow to hash; a cache emptied or
    swapped is a miss)."""
    __slots__ = ("device", "op", "device_id", "replay_key", "positions", "bridge", "program", "cache", "generation")

    def __init__(self, device, op, device_id, replay_key, positions, bridge=None):
        self.device, self.op, self.device_id = device, op, device_id
        self.replay_key, self.positions, self.bridge = replay_key, positions, bridge
        self.program, self.cache, self.generation = None, None, -1


MISS = object()


def lookup(key, args, kwargs):
    """The result of the call of signature `key` on these arguments from its remembered entry, or MISS."""
    entry = CACHE.get(key)
    if entry is None:
        return MISS
    program = entry.program
    if not program or entry.cache is not _replay.CACHE or entry.generation != _replay.generation:
        program = entry.program = _replay.CACHE.get(entry.replay_key)   # (not recorded yet: looked up again)
        entry.cache, entry.generation = _replay.CACHE, _replay.generation
    if not program or not _replay.enabled():
        return MISS
    values = (*args, *kwargs.values()) if kwargs else args
    bridge = entry.bridge
    if bridge is None:
        arrays = tuple([None if i is None else values[i] for i in entry.positions])
        with entry.device.scope(entry.op, entry.device_id):
            return program.run(entry.device, arrays)
    # torch CUDA tensors: torch's context entered, then the device scope, before the import, as `_arrays.Call` does
    with bridge.context(), entry.device.scope(entry.op, entry.device_id):
        to_array = bridge.to_array
        arrays = tuple([None if i is None else to_array(values[i]) for i in entry.positions])
        result = program.run(entry.device, arrays)
        if type(result) is tuple:
            return tuple([None if r is None else bridge.to_tensor(r) for r in result])
        return bridge.to_tensor(result)


class Note:
    """What a slow call did that its repeat needs: the GPU scopes it entered (`_arrays.Call`) and its `replayed`
    calls (the replay key, the arrays, the result)."""
    __slots__ = ("scopes", "replays", "bridge", "imports", "wrapped")

    def __init__(self):
        self.scopes: list = []
        self.replays: list = []
        self.bridge = None          # torch tensors: the call's `_arrays.TorchBridge`,
        self.imports: list = []     # [(tensor, the array imported from it)],
        self.wrapped = None         # (the result as arrays, as the tensors returned)


def remember(key, note: Note, args, kwargs, result) -> None:
    """Keep the entry of a call that succeeded, if it can be repeated (see the module docstring)."""
    if len(note.scopes) != 1 or len(note.replays) != 1:
        return
    replay_key, arrays, replayed = note.replays[0]
    if note.bridge is not None:   # torch tensors: the replay ran on their imports, and its result was exported
        if note.wrapped is None or note.wrapped[1] is not result:
            return
        result = note.wrapped[0]
        tensors = {id(array): tensor for tensor, array in note.imports}
        arrays = tuple(None if a is None else tensors.get(id(a), _MADE) for a in arrays)
    if not (result is replayed or (type(result) is tuple and type(replayed) is tuple and len(result) == len(replayed)
                                   and all(r is s for r, s in zip(result, replayed)))):
        return
    values = (*args, *kwargs.values()) if kwargs else args
    positions: list[int | None] = []
    for a in arrays:
        if a is None:
            positions.append(None)
            continue
        found = [i for i, v in enumerate(values) if v is a]
        if len(found) != 1:   # made by the call, or given twice (a repeat may give two arrays there)
            return
        positions.append(found[0])
    if len(CACHE) >= CACHE_LIMIT:
        CACHE.clear()
    device, op, device_id = note.scopes[0]
    CACHE[key] = Entry(device, op, device_id, replay_key, tuple(positions), note.bridge)


_MADE = object()   # stands for an array the call made (not imported from a tensor argument)


def noted_scope(device, op: str, device_id: int, bridge=None) -> None:
    """`_arrays.Call` entered `device`'s GPU scope for op on device_id (and, for torch tensors, `bridge`'s context)."""
    note = _replay.NOTE.get()
    if note is not None:
        note.scopes.append((device, op, device_id))
        if bridge is not None:
            note.bridge = bridge


def noted_import(tensor, array) -> None:
    """`_arrays.Call` imported torch tensor as array."""
    note = _replay.NOTE.get()
    if note is not None:
        note.imports.append((tensor, array))


def noted_wrap(result, tensors) -> None:
    """`_arrays.Call` returns result (arrays) as tensors."""
    note = _replay.NOTE.get()
    if note is not None:
        note.wrapped = (result, tensors)
