"""Replaying a GPU call's work: a signature seen before skips the planning and runs its recorded launches.

Measured on the first GPU run (H200, 2026-11-26, benchmarks/results/gpu-2026-11-26): every cupyconv call was
host-bound, 170-1500 us of Python per call against 9-900 us of kernels, spent in no one place -- planning (tile,
split and kernel choice), the launch arguments' checks and the array work's bookkeeping, 800-1400 Python calls
per forward.  None of it depends on values: a call's GPU work is a function of its signature alone -- the shapes,
strides, dtypes and alignments of its arrays, the spec, the algorithm, the settings and the device (the planners
read no values; benchmarks.launches checks it by planning over NaN and over zeros).

So the driver of every op (`lift.forward`, `lift.backward`) runs its GPU path through `replayed`: the first call
of a signature runs on a `Recorder`, a Device that forwards every primitive of the GPU path (`launch` (noted
prepared: `CudaDevice.launch_prepare`, the kernel looked up and its scalars wrapped once), `gemm_strided_batched`
(noted prepared: `CudaDevice.gemm_prepare`), `empty`, `copyto`, `add`, `sum`, `arrival_counters`) to the real
device and notes it, each array argument as a reference `Ref` (slot, byte offset, shape, strides, dtype) into a
slot -- one of the call's input arrays, or an array a primitive made; the later calls of that signature replay
the notes (a `Program`) on their own arrays: the same kernels, grids and scalars, the same GEMMs and array work,
on new buffers, each freed after its last use.  The results are views of the slots as recorded.  The buffers a call
makes for its own steps only (scratch) are taken as parts of fewer allocations (`_pooled`): CuPy's pool costs a
few microseconds a malloc and free.

A recording is not kept (the call still runs, unreplayed, every time) when it could be ambiguous: input arrays
whose memory overlaps (which one an argument lies in would be a guess), an array argument in memory that no slot
holds (made outside the Device's primitives), or an autotuning measurement during the call (the candidates'
trial runs are not the call's work; the next call, with the choice remembered, is recorded).  Only devices whose
arrays are CuPy's replay (`CudaDevice`, and the test suite's CupyHostDevice, which runs every op of
tests/test_cupy_arrays.py recorded and replayed); NumPy devices (the emulator's, the model's RecordingDevice)
always plan.  A `replayed` call made on a Recorder (the drivers inside an op's `lift.one_program`) is part of
the recording around it: it runs, neither recorded apart nor noted.
`CUPYCONV_REPLAY=0` in the environment turns replaying off (to compare, or to debug a planner).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
from dataclasses import dataclass

import numpy

from . import settings
from ._device import Device

#: Programs by signature; None marks a signature that cannot be recorded (see the module docstring).
CACHE: dict = {}
#: Counts the times CACHE was emptied (a program found in it stays valid until then: `_fastpath` keeps it).
generation = 0
CACHE_LIMIT = 4096   # signatures kept; past it the cache starts over (a program is a few kB)
ALIGNMENT = 256      # pointer alignments the planners may look at (vector widths: 16 bytes at most) and then some


#: The `_fastpath.Note` of the public call in progress on this thread or task, where it may be remembered: each
#: `replayed` call notes its key, arrays and result in it.
NOTE: contextvars.ContextVar = contextvars.ContextVar("cupyconv_fastpath_note", default=None)

#: The list a caller collects a call's offers in (`collecting_offers`): arrays its work hands over beside its result
#: (`offer`: the forward's channels-last copy of a 16-bit x, which cupyconv.torch's autograd saves in place of x).
#: A recording notes which of its slots were offered, so that each replay offers its own (a replayed call makes
#: the copy inside its program, where the code that offered it does not run).
OFFERS: contextvars.ContextVar = contextvars.ContextVar("cupyconv_offers", default=None)


@contextlib.contextmanager
def collecting_offers():
    """Within, the arrays the calls' work offers (`offer`) are appended to the yielded list."""
    offers: list = []
    token = OFFERS.set(offers)
    try:
        yield offers
    finally:
        OFFERS.reset(token)


def offer(a) -> None:
    """Hand a to the caller collecting offers, if one is."""
    offers = OFFERS.get()
    if offers is not None:
        offers.append(a)


def _reads_environ(environ=os.environ):
    """enabled(): whether CUPYCONV_REPLAY is not "0" in `environ` now, asked on every repeated call
    (`_fastpath.lookup`).

    `os.environ.get` of a variable that is not set costs 1-2 us on this project's CPU (10 under load): CPython's
    `_Environ.__getitem__` encodes the key and raises KeyError, which `Mapping.get` catches -- a few percent of a
    depthwise forward's host time.  CPython keeps the variables in `os.environ._data`, keyed by
    `os.environ.encodekey(name)`, and every change through os.environ (pytest's monkeypatch.setenv included) goes
    there: read directly, 0.2 us.  Private: probed here, against `environ.get`, which is the fallback."""
    name = "CUPYCONV_REPLAY"
    try:
        data, key, off = environ._data, environ.encodekey(name), environ.encodevalue("0")
        value = environ.get(name)
        usable = type(data) is dict and data.get(key) == (None if value is None else environ.encodevalue(value))
    except (TypeError, AttributeError):
        usable = False
    if not usable:
        def enabled() -> bool:
            return environ.get(name, "1") != "0"
        return enabled
    get = data.get

    def enabled() -> bool:
        return get(key) != off
    return enabled


enabled = _reads_environ()


@dataclass(frozen=True)
class Ref:
    """An array argument as recorded: a view of slot `slot` starting `offset` bytes past the slot's first element
    (negative for a view that walks back), with this shape, strides and dtype.  slot None: an empty array.  whole:
    the view is the slot's array itself (same start, shape, strides and dtype), so a replay passes that array and
    builds no view (an input, or what `empty` made, handed on as it is: most arguments of most launches)."""
    slot: int | None
    offset: int
    shape: tuple
    strides: tuple
    dtype: numpy.dtype
    whole: bool = False


def _span(a) -> tuple[int, int]:
    """[low, high) byte addresses that array a's elements occupy."""
    low = high = a.data.ptr
    for size, stride in zip(a.shape, a.strides):
        if stride < 0:
            low += (size - 1) * stride
        else:
            high += (size - 1) * stride
    return low, high + a.itemsize


def signature(a):
    """What of array a the planners may look at (also `_fastpath.signature`'s, for each CuPy array argument)."""
    if a is None:
        return None
    data = a.data
    return (a.shape, a.strides, a.dtype, data.device_id, data.ptr % ALIGNMENT)


class Unrecordable(Exception):
    """The call's work cannot be written as a program (see the module docstring)."""


class Recorder(Device):
    """The real device, with every primitive noted.  The compound array methods (`zeros`, `ascontiguous`,
    `astype`, `reshape`, `matmul_strided`) are Device's own, on this recorder, so their primitives are noted."""

    def __init__(self, device, inputs):
        self.device, self.xp = device, device.xp
        self.slots: list = []          # [(array, low, high)]: inputs first, then what primitives made
        self.steps: list = []          # [(method name, argument template, slot of the result or None)]
        self.valid, self.tuned = True, False
        self.offers: tuple = ()
        for a in inputs:
            if a is not None:
                self._new_slot(a)
        spans = sorted(s[1:] for s in self.slots if s[0].size)
        if any(high > low for (_, high), (low, _) in zip(spans, spans[1:])):
            self.valid = False         # overlapping inputs

    # What the op reads off the device, forwarded
    name = property(lambda self: self.device.name)
    tensor_cores = property(lambda self: self.device.tensor_cores)

    def __getattr__(self, attribute):   # compute_capability, function, cublas, ...
        return getattr(self.device, attribute)

    def total_memory(self):
        return self.device.total_memory()

    def key(self):
        return self.device.key()

    def scope(self, op, device_id):
        return self.device.scope(op, device_id)

    def timed(self, run):
        self.valid = False   # an autotuning trial: not the call's own work; the next call records
        self.tuned = True
        return self.device.timed(run)

    # The primitives, noted
    def launch(self, source, name, grid, block, args, shared_mem=0):
        # noted prepared (`Device.launch_prepare`): a replay runs the launch without looking its kernel up again or
        # converting its scalars again
        prepared, packed = self.device.launch_prepare(source, name, grid, block, args, shared_mem)
        self._note("launch_run", (prepared, packed))

    def gemm_strided_batched(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                             ldc, stride_c, batch):
        # noted prepared (`CudaDevice.gemm_prepare`): a replay runs the cuBLAS call without redoing its checks
        prepared = self.device.gemm_prepare(transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                                            beta, c, ldc, stride_c, batch)
        if prepared is not None:
            self._note("gemm_run", (prepared, a, b, c))

    def empty(self, shape, dtype):
        return self._note("empty", (shape, dtype), result=True)

    def copyto(self, dst, src):
        self._note("copyto", (dst, src))

    def add(self, dst, src):
        self._note("add", (dst, src))

    def sum(self, a, axis, dtype):
        return self._note("sum", (a, axis, dtype), result=True)

    def arrival_counters(self, size):
        # a replay asks its own device, so that a call replayed on another stream counts in that stream's array
        return self._note("arrival_counters", (size,), result=True)

    def _note(self, method, args, result=False):
        out = getattr(self.device, method)(*args)
        if self.valid:
            try:
                template = tuple(self._template(a) for a in args)
            except Unrecordable:
                self.valid = False
            else:
                self.steps.append((method, template, len(self.slots) if result else None))
        if result:
            self._new_slot(out)
        return out

    def _new_slot(self, a) -> None:
        self.slots.append((a, *_span(a)) if a.size else (a, 0, 0))

    def _template(self, a):
        if isinstance(a, tuple):
            return tuple(self._template(x) for x in a)
        if not isinstance(a, self.xp.ndarray):
            return a
        if a.size == 0:
            return Ref(None, 0, a.shape, a.strides, a.dtype)
        low, high = _span(a)
        for slot in range(len(self.slots) - 1, -1, -1):   # the newest first: a dead slot's memory may be reused
            base, base_low, base_high = self.slots[slot]
            if base_low <= low and high <= base_high:
                whole = (a.data.ptr == base.data.ptr and a.shape == base.shape and a.strides == base.strides
                         and a.dtype == base.dtype)
                return Ref(slot, a.data.ptr - base.data.ptr, a.shape, a.strides, a.dtype, whole)
        raise Unrecordable(f"an array argument ({a.shape}, {a.dtype}) lies in memory no slot holds")

    def program(self, result) -> Program:
        try:
            outputs = self._template(result)
        except Unrecordable:
            self.valid = False
        if not self.valid:
            raise Unrecordable("see the recording")
        offered = set(_slots_of(self.offers))
        results = frozenset(set(_slots_of(outputs)) - offered)
        steps, slots = _pooled(self._folded(outputs), set(results | offered), len(self.slots), results)
        return Program(steps, outputs, slots, self.offers)

    def _folded(self, outputs) -> list:
        """The steps as a replay needs them: an array argument without elements (a `Ref` of no slot: a split-K
        workspace of no split, say) made once here, instead of once per replay, and passed to every replay as it
        is (it holds no memory, and no kernel or array operation reads or writes an element of it); and an `empty`
        whose array no step, result or offer refers to (such an argument's own allocation) left out.  Results
        and offers without elements are still made anew by each replay: a caller may keep them."""
        made: dict = {}

        def fold(t):
            if type(t) is Ref and t.slot is None:
                key = (t.shape, t.strides, t.dtype)
                if key not in made:
                    made[key] = self.device.empty(t.shape, t.dtype)
                return made[key]
            if type(t) is tuple:
                return tuple(fold(x) for x in t)
            return t

        steps = [(method, fold(template), result) for method, template, result in self.steps]
        read = set(_slots_of((outputs, self.offers, tuple(template for _, template, _ in steps))))
        return [step for step in steps if not (step[0] == "empty" and step[2] not in read)]

    def offered(self, offers: list) -> None:
        """Note the arrays the recorded work offered (`offer`), for the program's replays to offer theirs."""
        try:
            self.offers = tuple(self._template(a) for a in offers)
        except Unrecordable:
            self.valid = False


class Program:
    """A recorded call: its steps, replayed on new inputs (`run`).  Each slot made by a step is dropped after the
    last step that reads it, unless a result is a view of it.  A step's arguments are kept as a list, with its
    references listed apart -- at the top, or one level down in a tuple (a launch's kernel arguments) -- each as
    the plain fields of its view, so that a replay rebuilds only what holds an array, with no Python call per view
    (counted by benchmarks.host_overhead: the views were most of a replay's Python calls)."""

    def __init__(self, steps, outputs, slots: int, offers: tuple = ()):
        self.outputs, self.slots, self.offers = outputs, slots, offers
        last = {}
        for i, (_, template, _) in enumerate(steps):
            for slot in _slots_of(template):
                last[slot] = i
        keep = set(_slots_of((outputs, offers)))
        drops: list[list[int]] = [[] for _ in steps]
        for slot, i in last.items():
            if slot not in keep:
                drops[i].append(slot)
        self.steps = [(method, list(template), *_places(template), result, drop)
                      for (method, template, result), drop in zip(steps, drops)]

    def run(self, device, inputs):
        ndarray, empty = device.xp.ndarray, device.empty
        buffers = [a for a in inputs if a is not None]
        buffers += [None] * (self.slots - len(buffers))
        for method, template, top, nested, result, drops in self.steps:
            args = template.copy() if top or nested else template
            for i, slot, offset, shape, strides, dtype, whole in top:
                args[i] = (buffers[slot] if whole else empty(shape, dtype) if slot is None else
                           ndarray(shape, dtype, memptr=buffers[slot].data + offset, strides=strides))
            for i, inner, refs in nested:
                values = inner.copy()
                for j, slot, offset, shape, strides, dtype, whole in refs:
                    values[j] = (buffers[slot] if whole else empty(shape, dtype) if slot is None else
                                 ndarray(shape, dtype, memptr=buffers[slot].data + offset, strides=strides))
                args[i] = tuple(values)
            out = args[0] if method == "part" else getattr(device, method)(*args)
            if result is not None:
                buffers[result] = out
            for dead in drops:
                buffers[dead] = None

        def view(ref):
            if ref.slot is None:   # no element: no memory to place it in
                return empty(ref.shape, ref.dtype)
            return ndarray(ref.shape, ref.dtype, memptr=buffers[ref.slot].data + ref.offset, strides=ref.strides)

        offers = OFFERS.get() if self.offers else None
        if offers is not None:
            offers.extend(view(ref) for ref in self.offers)
        return _materialise(self.outputs, view)


#: A result's allocation may carry scratch arrays of the call of up to this fraction of its own bytes (`_pooled`)
RESULT_SHARE = 64


def _pooled(steps: list, keep: set, slots: int, results: frozenset = frozenset()) -> tuple[list, int]:
    """(steps, slot count) with the call's scratch arrays -- each made by an `empty` step and read by later steps
    of the call only: not a result, not offered -- taken from one allocation (an "arena": a uint8 `empty` step) in
    groups, as views of it at 256-byte aligned offsets ("part" steps), instead of one allocation each: CuPy's pool
    costs a few microseconds a malloc and its free (the H100's host model: 2.9 us an allocation), and a tensor-core
    backward makes four such arrays (the channels-last copies of x and grad_output, split-K partials and sums).

    An arena is made where its first member was and lives until the last reader of any member, which may hold a
    member earlier or longer than before: a scratch array joins a group of others only where the call's peak of
    the memory its steps allocate does not rise (`_peak`).  Failing that, it may join a result's allocation (one
    made by an `empty` step, in `results`: not an offer), placed after the result (which stays at the arena's
    start), while the scratch so carried is at most 1/RESULT_SHARE of the result's bytes: the tensor-core forward's
    one scratch array, the weight in channels-last order (r50-64: 73 KB beside a 12.8 MB output), which no other
    array of its call could take.  Those bytes stay held as long as the result is, and the call's peak may rise by
    them: that is the price, bounded, of one allocation fewer a call.  The kernels read and write the same bytes:
    a part has the shape, strides and dtype recorded, an alignment of 256 bytes as the pool's, and memory no other
    live array holds.  Nothing is kept across calls: each replay makes its own arena from CuPy's pool, on its own
    stream."""
    scratch = [i for i, (method, template, result) in enumerate(steps)
               if method == "empty" and result not in keep and _nbytes(template)
               and any(result in _slots_of(t) for _, t, _ in steps[i + 1:])]
    peak = _peak(steps, keep)
    groups: list[list[int]] = []
    for i in scratch:
        for group in groups:
            trial = [g + [i] if g is group else g for g in groups]
            if _peak(_arenas(steps, trial, slots)[0], keep) <= peak:
                group.append(i)
                break
        else:
            groups.append([i])
    # The scratch arrays left alone, each into a result's allocation where its share allows
    budget = {i: _nbytes(template, rounded=True) // RESULT_SHARE for i, (method, template, result) in enumerate(steps)
              if method == "empty" and result in results}
    carried = 0
    for alone in [g for g in groups if len(g) == 1]:
        nbytes = _nbytes(steps[alone[0]][1], rounded=True)
        for host in budget:
            if budget[host] < nbytes:
                continue
            hosted: list[int] | None = next((g for g in groups if g[0] == host), None)
            trial = [g for g in groups if g is not alone and g is not hosted] + [(hosted or [host]) + alone]
            if _peak(_arenas(steps, trial, slots)[0], keep) <= peak + carried + nbytes:
                groups, budget[host], carried = trial, budget[host] - nbytes, carried + nbytes
                break
    return _arenas(steps, groups, slots)


def _arenas(steps: list, groups: list[list[int]], slots: int) -> tuple[list, int]:
    """(steps, slot count) with each group of two or more `empty` steps (their indices) made as parts of one arena,
    in the group's order, the arena where the first of them was."""
    first, parts = {}, {}
    for group in groups:
        if len(group) < 2:
            continue
        size = 0
        for i in group:
            parts[i] = (slots, size)
            size += _nbytes(steps[i][1], rounded=True)
        first[min(group)] = ("empty", (size, numpy.dtype(numpy.uint8)), slots)
        slots += 1
    pooled: list[tuple] = []
    for i, (method, template, result) in enumerate(steps):
        if i in first:
            pooled.append(first[i])
        if i in parts:
            shape, dtype = template
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            dtype = numpy.dtype(dtype)
            strides = tuple(math.prod(shape[k + 1:]) * dtype.itemsize for k in range(len(shape)))
            pooled.append(("part", (Ref(*parts[i], shape, strides, dtype),), result))
        else:
            pooled.append((method, template, result))
    return pooled, slots


def _nbytes(template: tuple, rounded: bool = False) -> int:
    """Bytes of the array of an `empty` step of arguments `template` (shape, dtype); rounded: up to whole 256-byte
    blocks, as a pool hands them out."""
    shape, dtype = template
    size = math.prod((shape,) if isinstance(shape, int) else shape) * numpy.dtype(dtype).itemsize
    return -(-size // ALIGNMENT) * ALIGNMENT if rounded else size


def _peak(steps: list, keep: set) -> int:
    """The most bytes that the arrays of the `empty` steps hold at once (each in whole 256-byte blocks, as the pool
    hands them out), each freed after the last reader of it or of a part of it (the kept ones never)."""
    base: dict = {}     # a part's slot -> its arena's
    last: dict = {}
    keep = set(keep)
    for i, (method, template, result) in enumerate(steps):
        if method == "part":
            base[result] = template[0].slot
            if result in keep:   # a result's arena: held as long as the result
                keep.add(template[0].slot)
        for slot in _slots_of(template):
            last[base.get(slot, slot)] = i
    live = peak = 0
    sizes: dict = {}
    for i, (method, template, result) in enumerate(steps):
        if method == "empty":
            sizes[result] = _nbytes(template, rounded=True)
            live += sizes[result]
            peak = max(peak, live)
        for slot in [s for s in sizes if last.get(s) == i and s not in keep]:
            live -= sizes.pop(slot)
    return peak


def _fields(i: int, ref: Ref) -> tuple:
    return (i, ref.slot, ref.offset, ref.shape, ref.strides, ref.dtype, ref.whole)


def _places(template) -> tuple[list, list]:
    """(top, nested) of a step's arguments: top the `_fields` of each reference at a position of its own, nested
    (i, the tuple at i as a list, the `_fields` of its references) for each tuple holding references."""
    top: list = []
    nested: list = []
    for i, t in enumerate(template):
        if type(t) is Ref:
            top.append(_fields(i, t))
        elif type(t) is tuple:
            refs = [_fields(j, x) for j, x in enumerate(t) if type(x) is Ref]
            if any(type(x) is tuple and any(_slots_of(x)) for x in t):
                raise Unrecordable("references nested two tuples deep")
            if refs:
                nested.append((i, list(t), refs))
    return top, nested


def _materialise(template, view):
    if type(template) is Ref:
        return view(template)
    if type(template) is tuple:
        return tuple(_materialise(t, view) for t in template)
    return template


def _slots_of(template):
    if type(template) is Ref:
        if template.slot is not None:
            yield template.slot
    elif type(template) is tuple:
        for t in template:
            yield from _slots_of(t)


def replayed(device, what: tuple, arrays: tuple, compute):
    """compute(device) -- the GPU work of one call on `arrays` (its array inputs, None for an absent one), `what`
    the rest of its signature (the run entry, spec, algorithm, ...) -- replayed from a recording where this
    signature was recorded before.  compute must read its arrays through the device it is given (the recorder
    passes itself)."""
    if device is None or device.xp is numpy or not enabled():
        return compute(device)
    if type(device) is Recorder:
        # Inside another call's recording (an op whose whole work is one program around the drivers:
        # `lift.one_program`): this work is part of that program, neither recorded apart nor noted.
        return compute(device)
    key = (device.key(), settings.snapshot(), what, tuple(signature(a) for a in arrays))
    program = CACHE.get(key, False)
    if program:
        result = program.run(device, arrays)
    elif program is None:
        result = compute(device)
    else:
        recorder = Recorder(device, arrays)
        with collecting_offers() as offers:   # whether or not this caller collects: the replays' callers may
            result = compute(recorder)
        recorder.offered(offers)
        for a in offers:
            offer(a)
        if not recorder.tuned:
            if len(CACHE) >= CACHE_LIMIT:
                global generation
                CACHE.clear()
                generation += 1
            CACHE[key] = None
            with contextlib.suppress(Unrecordable):
                CACHE[key] = recorder.program(result)
    note = NOTE.get()
    if note is not None:
        note.replays.append((key, arrays, result))
    return result
