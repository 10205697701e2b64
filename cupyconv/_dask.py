"""Dask arrays, the fourth array kind: every public op and its backward build a lazy dask graph.

`accepting_dask` wraps each public function (cupyconv/__init__.py applies it to the names in `OPS`): a call with
a dask array among its arguments goes to `lazy_call`, every other call to the function itself untouched.  dask
is imported only then, so `import cupyconv` never imports it.  The hook is there, not in `_arrays.Call`, because
a dask call returns a graph instead of running the op body, and because that keeps every op module unaware of
dask.  `OPS` describes each op once (its array arguments, how to validate its shapes, its output shape and
whether its spatial chunks map to windows); one mechanism serves them all:

- Each block is the op itself (the undecorated function, called by keyword) on NumPy or CuPy blocks, so the
  result has the chunk type of the input (`meta=`), and nothing is computed until the caller computes.  The
  settings in force at the call (TF32, autotune, determinism, workspace limit) apply to its blocks, in whatever
  thread or worker process they run.
- The chunked arguments (x, grad_output, cols) map block by block along their leading dims (the batch, or the
  patch dims of patch convolution and unfold/fold).  Their other dims are rechunked to one chunk, except the
  spatial dims of the windowed ops below.  The other arrays (weight, bias) are kept whole, one chunk each.
  In-memory NumPy/CuPy arguments become one-chunk dask arrays; torch tensors, or chunk types that differ from
  the dask arguments', raise TypeError as mixed kinds do for in-memory calls.
- Windowed ops (conv*, depthwise_conv*, patch_conv*, forward, and the weight and bias gradients of their
  `*_backward`): spatial chunks of x map to overlapping windows.  Output position p belongs to the block of the
  input chunk that holds position p * stride, so output chunk boundaries are ceil(boundary / stride): with
  stride 1 the output is chunked as x is (for 'same' padding, exactly).  Each output block reads the input
  region its windows cover (from p * stride - pad_low on), sliced from x with the halo its neighbours hold,
  and is computed with the padding that region needs: the op's own padding at the true borders, none inside.
  So x is not rechunked however its chunks and the stride fall; an input chunk that holds no output's
  position, or whose outputs would read nothing but padding, gets no output block of its own (it joins its
  neighbour's), so no output chunk is empty.
- The input gradient of the windowed ops keeps x's spatial chunks too, by the same halo exchange the other way
  round (`input_windows`): each chunk of x gets the input gradient of the region that the windows reaching into
  it read, from those outputs' grad_output rows, cut to the chunk (zeros where no window reaches).
- Ops mapped over the leading dims only, their spatial dims rechunked to one chunk: conv_transpose*, unfold/fold
  and their backward (as transposed windows, their blocks would need the same scheme; not done yet).
- Weight and bias gradients: one partial per block (leading blocks times spatial windows), summed in the compute
  dtype (float32 for 16-bit types) by a fixed tree of tasks (`SUM_FAN_IN` partials each, added in order by the
  path's Device), so the bits do not depend on the scheduler.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import math
import operator
import sys
import textwrap
import uuid
from dataclasses import dataclass
from typing import Callable

import numpy

from . import _arrays, _device, settings
from ._arrays import Call, compute_dtype
from ._spec import (NEEDS, ConvSpec, ceil_div, check_algorithm, check_needs, check_workspace_limit,
                    weight_spatial_dims)
from .ops import lift
from .ops.conv import ALGORITHMS as CONV_ALGORITHMS
from .ops.conv_transpose import _spec as transpose_spec
from .ops.patch import ALGORITHMS as PATCH_ALGORITHMS

# ---------------------------------------------------------------------------------------------------------
# The table: how each public op's arrays map onto chunks


@dataclass(frozen=True)
class Geometry:
    """What the dask path needs to know about one public op.

    spec: (op, arguments) -> ConvSpec, raising the op's own errors for bad shapes and window arguments.
    output_shape: the forward output's shape from the spec.
    chunked: the array arguments mapped along their leading dims (`len(spec.batch)` of them); the other array
    arguments are kept whole.  windowed: whether spatial chunks of x map to overlapping windows.
    """
    spec: Callable[[str, dict], ConvSpec]
    output_shape: Callable[[ConvSpec], tuple]
    chunked: tuple[str, ...]
    whole: tuple[str, ...] = ()
    windowed: bool = False
    algorithms: tuple[str, ...] | None = None
    backward: bool = False


def _conv_spec(op, a, nd, leading_dims=False):
    nd = nd or weight_spatial_dims(op, a["weight"].shape)
    return ConvSpec.for_conv(op, a["x"], a["weight"], a.get("bias"), a["stride"], a["padding"], a["dilation"],
                             a["groups"], nd=nd, leading_dims=leading_dims)


def _depthwise_spec(op, a, nd):
    return ConvSpec.for_depthwise(op, a["x"], a["weight"], a.get("bias"), a["stride"], a["padding"],
                                  a["dilation"], nd=nd)


def _transpose_spec(op, a, nd):
    """The spec of the convolution a transposed convolution transposes (its input is the transposed output)."""
    return transpose_spec(op, nd, a["x"], a["weight"], a.get("bias"), a["stride"], a["padding"],
                          a["output_padding"], a["groups"], a["dilation"])[0]


def _unfold_spec(op, a, name):
    return ConvSpec.for_unfold(op, a[name], a["kernel_size"], a["dilation"], a["padding"], a["stride"], name=name)


def _fold_spec(op, a, name, size_name):
    return ConvSpec.for_fold(op, a[name], a[size_name], a["kernel_size"], a["dilation"], a["padding"],
                             a["stride"], name=name, size_name=size_name)


def _unfold_output(spec):
    return (*spec.batch, spec.in_channels * spec.taps, spec.out_pixels)


OUTPUT, INPUT = operator.attrgetter("output_shape"), operator.attrgetter("input_shape")
ND = {"1d": 1, "2d": 2, "3d": 3}


def _table() -> dict[str, Geometry]:
    ops = {}
    families: dict[str, tuple] = {  # name prefix: (spec, output shape, windowed, algorithms, name suffixes and their spatial dims)
        "conv": (_conv_spec, OUTPUT, True, CONV_ALGORITHMS, {**ND, "_nd": None}),
        "depthwise_conv": (_depthwise_spec, OUTPUT, True, None, ND),
        "patch_conv": (functools.partial(_conv_spec, leading_dims=True), OUTPUT, True, PATCH_ALGORITHMS, ND),
        "conv_transpose": (_transpose_spec, INPUT, False, CONV_ALGORITHMS, {**ND, "_nd": None}),
    }
    for prefix, (spec, output, windowed, algorithms, suffixes) in families.items():
        for suffix, nd in suffixes.items():
            spec_nd = functools.partial(spec, nd=nd)
            ops[prefix + suffix] = Geometry(spec_nd, output, ("x",), ("weight", "bias"), windowed, algorithms)
            ops[f"{prefix}{suffix}_backward"] = Geometry(spec_nd, output, ("grad_output", "x"), ("weight",),
                                                         windowed, algorithms, backward=True)
    ops["unfold"] = Geometry(functools.partial(_unfold_spec, name="x"), _unfold_output, ("x",))
    ops["fold_backward"] = Geometry(functools.partial(_unfold_spec, name="grad_output"), _unfold_output,
                                    ("grad_output",))
    ops["fold"] = Geometry(functools.partial(_fold_spec, name="cols", size_name="output_size"), INPUT, ("cols",))
    ops["unfold_backward"] = Geometry(functools.partial(_fold_spec, name="grad_output", size_name="input_size"),
                                      INPUT, ("grad_output",))
    return ops


#: Every public op and its backward, by name.
OPS = _table()

NOTES = {
    (True, False): "The arrays may be dask arrays: the result is lazy; chunks of the leading dims map block to "
                   "block, spatial chunks to overlapping windows (see cupyconv._dask).",
    (False, False): "The arrays may be dask arrays: the result is lazy, mapped over the leading dims with the "
                    "other dims rechunked to one chunk (see cupyconv._dask).",
    (True, True): "The arrays may be dask arrays: lazy results; grad_x is chunked as x (spatial chunks from the "
                  "grad_output rows whose windows reach them), grad_weight and grad_bias summed from per-window "
                  "partials (see cupyconv._dask).",
    (False, True): "The arrays may be dask arrays: lazy results, mapped over the leading dims with the spatial "
                   "dims rechunked to one chunk; grad_weight and grad_bias summed from per-block partials (see "
                   "cupyconv._dask).",
}


# ---------------------------------------------------------------------------------------------------------
# Dispatch


def _is_dask(a) -> bool:
    return type(a).__module__.startswith("dask")


#: The argument types seen in public calls that are not dask's (a handful: builtins, NumPy, CuPy, torch).
_NOT_DASK: set = {int, float, bool, str, tuple, list, frozenset, type(None)}


def accepting_dask(fn):
    """fn, public under the same name in cupyconv, taking dask arrays as well."""
    geometry = OPS[fn.__name__]

    @functools.wraps(fn)
    def public(*args, **kwargs):
        # _is_dask inlined: this runs on every public call, dask or not (a type seen before is not asked again).
        for a in (*args, *kwargs.values()) if kwargs else args:
            if type(a) not in _NOT_DASK:
                if type(a).__module__.startswith("dask"):
                    return lazy_call(fn, args, kwargs)
                _NOT_DASK.add(type(a))
        return fn(*args, **kwargs)

    public.__module__ = "cupyconv"   # pickled by reference as what it is: cupyconv.<name>
    note = textwrap.fill(NOTES[geometry.windowed, geometry.backward], 116, initial_indent="    ",
                         subsequent_indent="    ")
    public.__doc__ = f"{fn.__doc__ or ''}\n\n{note}\n"
    return public


def _describe(a) -> str:
    import dask.array as da
    if isinstance(a, da.Array):
        return f"a dask array of {_arrays._describe(a._meta).removeprefix('a ')} chunks"
    return _arrays._describe(a)


def _chunk_meta(op: str, arrays: dict):
    """The (empty) chunk of the dask arguments, after checking that every array is a dask array or an in-memory
    one of that chunk type, with known chunk sizes and the dtypes an in-memory call accepts."""
    import dask.array as da
    for name, a in arrays.items():
        if _is_dask(a) and not isinstance(a, da.Array):
            raise TypeError(f"{op}: {name} must be a dask.array.Array, numpy.ndarray or cupy.ndarray, got "
                            f"{_describe(a)}")
        if _is_dask(a) and any(math.isnan(s) for s in a.shape):
            raise ValueError(f"{op}: {name} has unknown chunk sizes {a.chunks}; call {name}.compute_chunk_sizes() "
                             f"first")
    metas = {name: a._meta if _is_dask(a) else a for name, a in arrays.items()}
    first_name, first = next((name, a) for name, a in arrays.items() if _is_dask(a))
    for name, a in arrays.items():
        kind = _arrays._kind(metas[name])
        if kind not in ("numpy", "cupy") or kind != _arrays._kind(first._meta):
            raise TypeError(f"{op}: {first_name} is {_describe(first)} but {name} is {_describe(a)}; with dask "
                            f"arrays, the other arrays of the call must be dask arrays or in-memory arrays of the "
                            f"same chunk type")
    Call(op, **metas)  # the dtype rules of an in-memory call
    return first._meta


# ---------------------------------------------------------------------------------------------------------
# Windows: spatial chunks of x mapped to output blocks


@dataclass(frozen=True)
class Window:
    """One output block along one spatial dim, the input region it reads and the padding around that region."""
    out: tuple[int, int]
    region: tuple[int, int]
    padding: tuple[int, int]


def dim_windows(chunks: tuple[int, ...], spec: ConvSpec, dim: int) -> list[Window]:
    """The output blocks along spatial dim `dim` of x chunked as `chunks` (see the module docstring)."""
    n, o, s = spec.in_size[dim], spec.out_size[dim], spec.stride[dim]
    extent = spec.dilation[dim] * (spec.kernel_size[dim] - 1) + 1
    low, high = spec.padding[dim]
    boundaries = itertools.accumulate(chunks[:-1])
    starts = sorted({0} | {ceil_div(b, s) for b in boundaries})
    # An interior start p survives if its window starts inside x and the window before it ends inside x.
    starts = [p for p in starts if p == 0 or (p < o and p * s - low < n and (p - 1) * s - low + extent > 0)]
    if len(starts) == 1:
        return [Window((0, o), (0, n), (low, high))]
    blocks = []
    for p, q in zip(starts, starts[1:] + [o]):
        first, end = p * s - low, (q - 1) * s - low + extent
        blocks.append(Window((p, q), (max(first, 0), min(end, n)), (max(-first, 0), max(end - n, 0))))
    return blocks


def input_windows(chunks: tuple[int, ...], spec: ConvSpec, dim: int) -> list:
    """For the input gradient along spatial dim `dim` of x chunked as `chunks`: per chunk [a, b), (a, b) and the
    Window of the outputs whose windows reach into it (their grad_output rows, the input region those windows
    read and its padding), or None where no window does (the chunk's gradient is zeros).  The gradient of that
    region, computed from those outputs alone, is exact on [a, b): every output that reads a position there is
    among them (a halo exchange, as the forward's)."""
    n, o, s = spec.in_size[dim], spec.out_size[dim], spec.stride[dim]
    extent = spec.dilation[dim] * (spec.kernel_size[dim] - 1) + 1
    low = spec.padding[dim][0]
    blocks: list[tuple[tuple[int, int], Window | None]] = []
    for a, b in zip(itertools.accumulate((0, *chunks[:-1])), itertools.accumulate(chunks)):
        p, q = max(0, ceil_div(a + low - extent + 1, s)), min(o, (b - 1 + low) // s + 1)
        if q <= p:
            blocks.append(((a, b), None))
            continue
        first, end = p * s - low, (q - 1) * s - low + extent
        blocks.append(((a, b), Window((p, q), (max(first, 0), min(end, n)), (max(-first, 0), max(end - n, 0)))))
    return blocks


# ---------------------------------------------------------------------------------------------------------
# Blocks


def _settings_now() -> dict:
    """The value of every setting in force here (each has get_<name> and a context manager <name>)."""
    names = [name.removeprefix("get_") for name in settings.__all__ if name.startswith("get_")]
    return {name: getattr(settings, f"get_{name}")() for name in names}


def _one_block(block):
    """An argument of a task: blockwise (concatenate=False) nests it in a one-element list per dim the map does not
    run over; every such dim is one chunk (`LazyCall._block_arrays`), so there is nothing to concatenate (a
    concatenation of one CuPy block would still copy it with a kernel)."""
    while isinstance(block, list):
        (block,) = block
    return block


def run_block(fn, fixed: dict, names: tuple[str, ...], settings_values: dict, pick, leading: int | None, *blocks):
    """One task: fn on the blocks (given by keyword as `names`) and the fixed arguments, under the caller's
    settings; `pick` selects one gradient of a backward; `leading` (for a partial) adds that many unit dims in
    front, one per leading dim."""
    blocks = tuple(_one_block(b) for b in blocks)
    with contextlib.ExitStack() as scopes:
        for name, value in settings_values.items():
            scopes.enter_context(getattr(settings, name)(value))
        result = fn(**fixed, **dict(zip(names, blocks)))
    if pick is not None:
        result = result[pick]
    if leading is not None:
        result = result[(None,) * leading]
    return result


def _one_chunk(a):
    """An in-memory NumPy or CuPy argument as a one-chunk dask array of a copy of it, as dask.array.from_array
    makes it (the copy keeps later writes to `a` out of the graph), with the copy made by the Device of a's path:
    from_array's own `a.copy()` would run CuPy's kernel directly."""
    import dask.array as da
    xp = numpy if _arrays._kind(a) == "numpy" else sys.modules["cupy"]
    ops = lift.arrays(_device.executor_for(xp))
    copy = ops.empty(a.shape, a.dtype)
    ops.copyto(copy, a)
    name = f"cupyconv-array-{uuid.uuid4().hex}"
    return da.Array({(name, *(0,) * copy.ndim): copy}, name, tuple((size,) for size in copy.shape), dtype=copy.dtype,
                    meta=copy[(slice(0, 0),) * copy.ndim])


class LazyCall:
    """One public call on dask arrays: its arguments as dask arrays, its spec, and the blockwise maps."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.op = fn, fn.__name__
        self.geometry = OPS[self.op]
        bound = inspect.signature(fn).bind(*args, **kwargs)
        bound.apply_defaults()
        self.arguments = dict(bound.arguments)
        names = [name for name in self.geometry.chunked + self.geometry.whole if self.arguments.get(name) is not None]
        self.meta = _chunk_meta(self.op, {name: self.arguments[name] for name in names})
        for name in names:
            a = self.arguments[name]
            self.arguments[name] = a if _is_dask(a) else _one_chunk(a)
        self.spec = self.geometry.spec(self.op, self.arguments)
        if self.geometry.algorithms is not None:
            check_algorithm(self.op, self.arguments["algorithm"], self.geometry.algorithms)
            check_workspace_limit(self.op, self.arguments.get("workspace_limit"))
        self.leading = len(self.spec.batch)
        self.dtype = self.meta.dtype
        self.settings = _settings_now()
        self.array_names = names

    def windows(self) -> list[list[Window]]:
        """The output blocks along each spatial dim of x (windowed ops only)."""
        x, nd = self.arguments["x"], self.spec.nd
        return [dim_windows(x.chunks[x.ndim - nd + d], self.spec, d) for d in range(nd)]

    def _block_arrays(self, window):
        """The arrays of one output block: chunked ones cut to the window's regions (x: the input region,
        grad_output: the output block) and rechunked to one chunk past the leading dims; whole ones as one chunk."""
        arrays = {}
        for name in self.array_names:
            a = self.arguments[name]
            if name in self.geometry.chunked:
                if window is not None:   # (dask returns a itself for a cut that takes every position)
                    a = a[(Ellipsis, *(slice(*(w.out if name == "grad_output" else w.region)) for w in window))]
                a = a.rechunk({axis: -1 for axis in range(self.leading, a.ndim)})
            else:
                a = a.rechunk(-1)
            arrays[name] = a
        return arrays

    def map(self, window, trailing_shape, pick=None, partial=False, **overrides):
        """One blockwise map over the leading dims: the op on each block of the window, the result's dims past
        the leading ones `trailing_shape`; a partial is one result per leading block (unit leading chunks)."""
        import dask.array as da
        from dask.array.utils import meta_from_array
        arrays = self._block_arrays(window)
        leading = tuple(f"lead{i}" for i in range(self.leading))
        pairs = []
        for name, a in arrays.items():
            index = leading if name in self.geometry.chunked else ()
            pairs += [a, (*index, *(f"{name}{i}" for i in range(len(index), a.ndim)))]
        fixed = {k: v for k, v in self.arguments.items() if k not in arrays}
        if window is not None:
            fixed["padding"] = tuple(w.padding for w in window)
        fixed.update(overrides)
        trailing = tuple(f"out{i}" for i in range(len(trailing_shape)))
        block = functools.partial(run_block, self.fn, fixed, tuple(arrays), self.settings, pick,
                                  self.leading if partial else None)
        return da.blockwise(block, leading + trailing, *pairs, new_axes=dict(zip(trailing, trailing_shape)),
                            adjust_chunks={i: 1 for i in leading} if partial else None, concatenate=False,
                            dtype=self.dtype, meta=meta_from_array(self.meta, len(leading + trailing)),
                            token=f"cupyconv-{self.op}")


# ---------------------------------------------------------------------------------------------------------
# Results


def _forward(call: LazyCall):
    """The op's output: one map per output block, assembled along the spatial dims."""
    shape = call.geometry.output_shape(call.spec)[call.leading:]
    if not call.geometry.windowed:
        return call.map(None, shape)
    per_dim = call.windows()

    def blocks(window: tuple[Window, ...]):
        """The output blocks whose windows start with `window`: nested lists over the remaining dims."""
        if len(window) < len(per_dim):
            return [blocks((*window, w)) for w in per_dim[len(window)]]
        sizes = tuple(stop - start for start, stop in (w.out for w in window))
        return call.map(window, (*shape[:-len(sizes)], *sizes))
    return _assemble(blocks(()))


def _assemble(nested):
    """dask.array.block of nested lists of blocks, or the block itself where there is one (da.block would join
    even one block's meta with the array module's concatenate, a kernel launch for CuPy metas)."""
    import dask.array as da
    single = nested
    while isinstance(single, list) and len(single) == 1:
        single = single[0]
    return single if not isinstance(single, list) else da.block(nested)


SUM_FAN_IN = 8   # partial gradients added up by one task of `_partial_sum`'s tree


def add_partials(shape, dtype, *parts):
    """One task of `_partial_sum`'s tree: parts (of `shape` after their unit leading dims) added in order in dtype,
    by the Device of their path (a CuPy sum is a kernel: the executor's array work, as in the ops)."""
    xp = numpy if _arrays._kind(parts[0]) == "numpy" else sys.modules["cupy"]
    ops = lift.arrays(_device.executor_for(xp))
    total = ops.empty(shape, dtype)
    ops.copyto(total, ops.reshape(parts[0], shape))
    for part in parts[1:]:
        ops.add(total, ops.reshape(part, shape))
    return total


def _input_gradient(call: LazyCall):
    """grad_x of a windowed op, chunked as x: per chunk of x (along every spatial dim), the input gradient of the
    region its outputs' windows read, from their grad_output rows, cut to the chunk (`input_windows`)."""
    import dask.array as da
    x, nd = call.arguments["x"], call.spec.nd
    per_dim = [input_windows(x.chunks[x.ndim - nd + d], call.spec, d) for d in range(nd)]
    channels = x.shape[call.leading:x.ndim - nd]

    def blocks(picked: tuple):
        if len(picked) < nd:
            return [blocks((*picked, w)) for w in per_dim[len(picked)]]
        chunk = tuple(slice(a, b) for (a, b), _ in picked)
        if any(w is None for _, w in picked):   # no window reads this chunk
            return da.zeros_like(x[(Ellipsis, *chunk)])
        window = tuple(w for _, w in picked)
        region = tuple(w.region[1] - w.region[0] for w in window)
        grad = call.map(window, (*channels, *region), pick=0, needs=("input",))
        # The region may start after the chunk or end before it (positions no window reads): zeros there.
        grad = grad[(Ellipsis, *(slice(max(a, w.region[0]) - w.region[0], min(b, w.region[1]) - w.region[0])
                                 for (a, b), w in picked))]
        outside = [(max(w.region[0] - a, 0), max(b - w.region[1], 0)) for (a, b), w in picked]
        if any(any(sides) for sides in outside):
            grad = da.pad(grad, [(0, 0)] * (grad.ndim - nd) + outside)
            grad = grad.rechunk({axis: -1 for axis in range(grad.ndim - nd, grad.ndim)})   # the chunk's, one block
        return grad
    return _assemble(blocks(()))


def _partial_sum(call: LazyCall, pick: int, shape):
    """A weight or bias gradient: one partial per leading block and window, summed in the compute dtype by a tree
    of tasks in a fixed order (windows, then leading blocks), rounded to the call's dtype once at the root."""
    import dask
    import dask.array as da
    from dask.array.utils import meta_from_array
    windows = itertools.product(*call.windows()) if call.geometry.windowed else [None]
    parts = [block for window in windows
             for block in call.map(window, shape, pick=pick, partial=True, needs=(NEEDS[pick],)).to_delayed().ravel()]
    add = dask.delayed(add_partials)
    acc = compute_dtype(call.dtype)
    while len(parts) > SUM_FAN_IN:
        parts = [add(shape, acc, *parts[i:i + SUM_FAN_IN]) for i in range(0, len(parts), SUM_FAN_IN)]
    total = add(shape, acc, *parts)   # the root: every partial, or the sums of the level below
    rounded = dask.delayed(_rounded)(total, call.dtype)
    return da.from_delayed(rounded, shape, dtype=call.dtype, meta=meta_from_array(call.meta, len(shape)))


def _rounded(total, dtype):
    """The root's sum in the call's dtype (one rounding)."""
    xp = numpy if _arrays._kind(total) == "numpy" else sys.modules["cupy"]
    return lift.arrays(_device.executor_for(xp)).astype(total, dtype)


def _backward(call: LazyCall):
    """(grad_x, grad_weight, grad_bias), None where `needs` does not ask."""
    needs = check_needs(call.op, call.arguments["needs"])
    output_shape = call.geometry.output_shape(call.spec)
    grad_output = call.arguments["grad_output"]
    if tuple(grad_output.shape) != tuple(output_shape):
        raise ValueError(f"{call.op}: grad_output has shape {tuple(grad_output.shape)} but the forward output of x "
                         f"{tuple(call.arguments['x'].shape)} and weight {tuple(call.arguments['weight'].shape)} "
                         f"has shape {tuple(output_shape)}")
    x, weight = call.arguments["x"], call.arguments["weight"]
    grad_x = grad_w = grad_b = None
    if "input" in needs and call.geometry.windowed:
        grad_x = _input_gradient(call)
    elif "input" in needs:
        grad_x = call.map(None, x.shape[call.leading:], pick=0, needs=("input",))
    if "weight" in needs:
        grad_w = _partial_sum(call, 1, weight.shape)
    if "bias" in needs:
        grad_b = _partial_sum(call, 2, (output_shape[call.leading],))
    return grad_x, grad_w, grad_b


def lazy_call(fn, args, kwargs):
    """The public op fn on dask arrays: a lazy dask array, or a tuple of them for a backward."""
    call = LazyCall(fn, args, kwargs)
    return _backward(call) if call.geometry.backward else _forward(call)
