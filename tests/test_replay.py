"""Replaying recorded GPU work (cupyconv/_replay.py) through real CuPy arrays on the emulator (CupyHostDevice).

Every op test of tests/test_cupy_arrays.py runs twice here, the cache emptied first: the first run records, the
second -- on other random inputs, so a replay that read the first run's buffers would show -- must replay (a
program runs) and still equal the CPU path.  Then the cases a recording must refuse, and what a replay must not
touch.
"""
from __future__ import annotations

import math

import numpy
import pytest

import cupyconv
import reference as ref
import test_cupy_arrays as tca
from cupyconv import _device, _replay, settings
from emulator import CupyHostDevice

OP_TESTS = [*[(tca.test_unfold_fold, {"nd": n}) for n in (1, 2, 3)]] + [(tca.test_conv2d, {"algorithm": a}) for a in ("auto", "im2col_gemm", "direct")] + [
    (tca.test_conv2d_pointwise_and_chunked, {}),
    *[(tca.test_conv2d_implicit_gemm, {"dtype": d}) for d in ("float16", "bfloat16")],
    (tca.test_conv2d_implicit_gemm_strict_float32, {}),
    (tca.test_conv2d_tf32, {}),
    *[(tca.test_conv1d_conv3d_conv_nd, {"nd": n}) for n in (1, 3)],
    (tca.test_conv3d_in_chunks, {}),
    *[(tca.test_conv_transpose, {"nd": n}) for n in (1, 2, 3)],
    *[(tca.test_depthwise, {"nd": n}) for n in (1, 2, 3)],
    *[(tca.test_patch_conv2d, {"algorithm": a}) for a in ("fused", "im2col_gemm", "implicit_gemm")],
    *[(tca.test_patch_conv1d_conv3d, {"nd": n}) for n in (1, 3)],
]


@pytest.fixture(scope="module")
def device():
    return CupyHostDevice()


@pytest.fixture
def counted(monkeypatch):
    """{'recorded': calls recorded, 'replayed': programs run}, counted from here on, the cache emptied."""
    monkeypatch.setattr(_replay, "CACHE", {})
    counts = {"recorded": 0, "replayed": 0}
    record, run = _replay.Recorder.program, _replay.Program.run

    def counting_program(self, result):
        program = record(self, result)
        counts["recorded"] += 1
        return program

    def counting_run(self, device, inputs):
        counts["replayed"] += 1
        return run(self, device, inputs)

    monkeypatch.setattr(_replay.Recorder, "program", counting_program)
    monkeypatch.setattr(_replay.Program, "run", counting_run)
    return counts


@pytest.mark.parametrize("test, kwargs", OP_TESTS, ids=[f"{t.__name__[5:]}-{'-'.join(map(str, k.values()))}"
                                                          for t, k in OP_TESTS])
def test_every_op_replays_and_stays_right(device, counted, monkeypatch, test, kwargs):
    test(device, **kwargs)
    assert counted["recorded"] > 0 and counted["replayed"] == 0
    for program in filter(None, _replay.CACHE.values()):
        check_drops(program)
    recorded = counted["recorded"]
    inputs = tca.inputs
    monkeypatch.setattr(tca, "inputs", lambda seed, *shapes, **kw: inputs(seed + 1000, *shapes, **kw))
    test(device, **kwargs)   # the same signatures, other values: replayed, and still the CPU path's results
    assert counted["replayed"] >= recorded
    assert counted["recorded"] == recorded


def check_drops(program):
    """A slot is dropped only after the last step that reads it, and never when a result is a view of it."""
    dropped: set = set()
    for method, template, _, _, result, drops in program.steps:
        read = set(_replay._slots_of(tuple(template)))
        assert not read & dropped, f"{method} reads a dropped slot"
        assert result not in dropped
        dropped.update(drops)
    assert not set(_replay._slots_of(program.outputs)) & dropped


def conv2d_arrays(device, seed, dtype="float32", groups=2):
    x, w, b = tca.inputs(seed, (2, 4, 7, 6), (6, 4 // groups, 3, 3), (6,), dtype=dtype)
    return (x, w, b), [device.asarray(a) for a in (x, w, b)]


def test_a_replay_writes_new_arrays_only(device, counted):
    """The second call's results are new memory: the first call's results and both calls' inputs are untouched."""
    (x1, w1, b1), first = conv2d_arrays(device, 1)
    (x2, w2, b2), second = conv2d_arrays(device, 2)
    with _device.use_device(device):
        y1 = cupyconv.conv2d(*first, padding=1, groups=2)
        kept = device.asnumpy(y1)
        y2 = cupyconv.conv2d(*second, padding=1, groups=2)
    assert counted == {"recorded": 1, "replayed": 1}
    numpy.testing.assert_array_equal(device.asnumpy(y1), kept)
    for host, array in zip((x1, w1, b1, x2, w2, b2), first + second):
        numpy.testing.assert_array_equal(device.asnumpy(array), host)
    ref.assert_close(device.asnumpy(y2), cupyconv.conv2d(x2, w2, b2, padding=1, groups=2), "float32", "replayed")
    assert y2.data.ptr != y1.data.ptr


def test_a_replay_launches_what_the_recorded_call_launched(device, counted):
    _, first = conv2d_arrays(device, 3, "float16", groups=1)
    _, second = conv2d_arrays(device, 4, "float16", groups=1)
    with _device.use_device(device):
        start = len(device.launches)
        cupyconv.conv2d(*first, padding=1)
        middle = len(device.launches)
        cupyconv.conv2d(*second, padding=1)
    assert counted == {"recorded": 1, "replayed": 1}
    assert middle > start and device.launches[middle:] == device.launches[start:middle]


def test_a_replayed_gemm_runs_as_prepared(device, counted, monkeypatch):
    """im2col + cuBLAS: the recording prepares each GEMM (`CudaDevice.gemm_prepare`: its checks and cuBLAS
    arguments); a replay runs the prepared calls on its own arrays, no preparing, the same cuBLAS calls (compute
    type, modes, alpha, beta) and the CPU path's result."""
    prepared = []
    real = _device.CudaDevice.gemm_prepare
    monkeypatch.setattr(_device.CudaDevice, "gemm_prepare", lambda self, *a: prepared.append(1) or real(self, *a))
    _, first = conv2d_arrays(device, 6)
    (x, w, b), second = conv2d_arrays(device, 7)
    with _device.use_device(device):
        start = len(device.blas.gemms)
        cupyconv.conv2d(*first, padding=1, groups=2, algorithm="im2col_gemm")
        recorded, middle = len(prepared), len(device.blas.gemms)
        y = cupyconv.conv2d(*second, padding=1, groups=2, algorithm="im2col_gemm")
    assert counted == {"recorded": 1, "replayed": 1}
    assert recorded > 0 and len(prepared) == recorded
    assert middle > start and device.blas.gemms[middle:] == device.blas.gemms[start:middle]
    ref.assert_close(device.asnumpy(y), cupyconv.conv2d(x, w, b, padding=1, groups=2), "float32", "replayed")


def test_a_changed_signature_plans_again(device, counted):
    """Another stride, dtype, layout, setting or alignment of an input is another signature."""
    (x, w, b), arrays = conv2d_arrays(device, 5)
    xs = device.asarray(numpy.ascontiguousarray(x.swapaxes(-1, -2))).swapaxes(-1, -2)   # the same values, strided
    offset = device.asarray(numpy.concatenate([[0], x.ravel()]).astype(x.dtype))[1:].reshape(x.shape)
    with _device.use_device(device):
        y = [cupyconv.conv2d(*arrays, padding=1, groups=2)]
        y.append(cupyconv.conv2d(xs, *arrays[1:], padding=1, groups=2))
        y.append(cupyconv.conv2d(offset, *arrays[1:], padding=1, groups=2))   # 4 bytes off the alignment
        with settings.workspace_limit(1000):
            y.append(cupyconv.conv2d(*arrays, padding=1, groups=2, algorithm="im2col_gemm"))
            y.append(cupyconv.conv2d(*arrays, padding=1, groups=2))
    assert counted == {"recorded": 5, "replayed": 0}
    want = cupyconv.conv2d(x, w, b, padding=1, groups=2)
    for got in y:
        ref.assert_close(device.asnumpy(got), want, "float32", "conv2d")


def test_overlapping_inputs_are_never_recorded(device, counted):
    """x and weight views of one buffer that share elements: which slot an argument lies in would be a guess, so no
    program is kept and every call plans (and is right)."""
    rng = numpy.random.default_rng(6)
    buffer = device.asarray(ref.random(rng, (2 * 4 * 7 * 6,), numpy.dtype("float32")))
    x, w = buffer.reshape(2, 4, 7, 6), buffer[100:100 + 6 * 4 * 3 * 3].reshape(6, 4, 3, 3)
    with _device.use_device(device):
        for _ in range(2):
            y = cupyconv.conv2d(x, w, padding=1)
            ref.assert_close(device.asnumpy(y), cupyconv.conv2d(device.asnumpy(x), device.asnumpy(w), padding=1),
                             "float32", "conv2d")
    assert counted == {"recorded": 0, "replayed": 0}
    assert list(_replay.CACHE.values()) == [None]


def test_an_autotuned_call_is_recorded_only_once_its_choice_is_made(device, counted, monkeypatch):
    monkeypatch.setattr(cupyconv._autotune, "CACHE", {})
    (x, w, b), arrays = conv2d_arrays(device, 7)
    with _device.use_device(device), settings.autotune(True):
        for _ in range(3):
            y = cupyconv.conv2d(*arrays, padding=1, groups=2)
    assert counted == {"recorded": 1, "replayed": 1}
    ref.assert_close(device.asnumpy(y), cupyconv.conv2d(x, w, b, padding=1, groups=2), "float32", "conv2d")


def test_replay_can_be_turned_off(device, counted, monkeypatch):
    monkeypatch.setenv("CUPYCONV_REPLAY", "0")
    _, arrays = conv2d_arrays(device, 8)
    with _device.use_device(device):
        for _ in range(2):
            cupyconv.conv2d(*arrays, padding=1, groups=2)
    assert counted == {"recorded": 0, "replayed": 0} and not _replay.CACHE


def test_numpy_devices_always_plan(counted):
    """The emulator's NumPy device (and the model's RecordingDevice) plan every call: the model must see it."""
    from emulator import EmulatedDevice
    x, w = tca.inputs(9, (2, 4, 7, 6), (6, 4, 3, 3))
    want = cupyconv.conv2d(x, w, padding=1)   # the CPU path
    with _device.use_device(EmulatedDevice()):
        for _ in range(2):
            ref.assert_close(cupyconv.conv2d(x, w, padding=1), want, "float32", "conv2d")
    assert counted == {"recorded": 0, "replayed": 0} and not _replay.CACHE


def test_a_replay_hands_on_whole_arrays_and_views_the_rest(device, counted, monkeypatch):
    """An argument that is a slot's array itself (an input, what `empty` made) is passed as that array; a view into
    a slot (conv1d's input seen with a unit height) is rebuilt on the new buffer.  Either way the results stay
    right."""
    (_, _, _), first = conv2d_arrays(device, 9)
    (x2, w2, b2), second = conv2d_arrays(device, 10)
    lines = [[device.asarray(a) for a in tca.inputs(seed, (2, 4, 9), (6, 2, 3))] for seed in (12, 13)]
    seen: list = []
    launch_run = device.launch_run

    def noting_launch(prepared, args):   # a replay's launches are prepared (`CudaDevice.launch_prepare`)
        seen.extend(args)
        return launch_run(prepared, args)

    with _device.use_device(device):
        cupyconv.conv2d(*first, padding=1, groups=2)
        cupyconv.conv1d(*lines[0], padding=1, groups=2)
        monkeypatch.setattr(device, "launch_run", noting_launch)
        y = cupyconv.conv2d(*second, padding=1, groups=2)
        assert any(a is second[0] for a in seen) and any(a is second[1] for a in seen)
        seen.clear()
        y1 = cupyconv.conv1d(*lines[1], padding=1, groups=2)
        x1 = lines[1][0]
        assert not any(a is x1 for a in seen)
        assert any(getattr(a, "shape", None) == (2, 4, 1, 9) and a.data.ptr == x1.data.ptr for a in seen)
    assert counted == {"recorded": 2, "replayed": 2}
    ref.assert_close(device.asnumpy(y), cupyconv.conv2d(x2, w2, b2, padding=1, groups=2), "float32", "conv2d")
    x1, w1 = tca.inputs(13, (2, 4, 9), (6, 2, 3))
    ref.assert_close(device.asnumpy(y1), cupyconv.conv1d(x1, w1, padding=1, groups=2), "float32", "conv1d")


def test_an_emptied_cache_is_a_new_generation_the_fast_path_sees(device, counted, monkeypatch):
    """Past CACHE_LIMIT the cache starts over and `generation` counts it: a program the fast path had found is
    looked up again (and recorded again), not run from the fast path's own reference."""
    monkeypatch.setattr(_replay, "CACHE_LIMIT", 1)
    (x, w, b), arrays = conv2d_arrays(device, 11)
    generation = _replay.generation
    with _device.use_device(device):
        for _ in range(2):
            cupyconv.conv2d(*arrays, padding=1, groups=2)
        cupyconv.conv2d(*arrays, padding=2, groups=2)   # another signature: the cache is full, emptied
        assert _replay.generation == generation + 1
        y = cupyconv.conv2d(*arrays, padding=1, groups=2)
    assert counted == {"recorded": 3, "replayed": 1}
    ref.assert_close(device.asnumpy(y), cupyconv.conv2d(x, w, b, padding=1, groups=2), "float32", "conv2d")


def test_a_replayed_weight_gradient_counts_in_its_own_streams_array(device, counted, monkeypatch):
    """The tensor-core weight gradient's arrival counts (`Device.arrival_counters`, one array per stream) are a
    step of the program, not a recorded array: a replay on another stream asks that stream's array, so replays in
    flight on two streams never share a count.  Several splits (their last block finishes each tile): the same
    results as the CPU path on every stream, and every count back at 0."""
    from cupyconv.ops import implicit_gemm as igemm
    monkeypatch.setattr(igemm, "TC_SPLIT_BLOCKS", 10**6)
    monkeypatch.setattr(igemm, "TC_SPLIT_CHUNKS", 1)
    stream = {"key": "a"}
    monkeypatch.setattr(device, "stream_key", lambda: stream["key"])
    monkeypatch.setattr(device, "_arrivals", {}, raising=False)
    rng = numpy.random.default_rng(41)
    for key in ("a", "b", "a"):
        stream["key"] = key
        x, w = rng.standard_normal((2, 16, 9, 8)).astype(numpy.float16), rng.standard_normal((8, 16, 3, 3))
        gy = rng.standard_normal((2, 8, 9, 8)).astype(numpy.float16)
        w = w.astype(numpy.float16)
        with _device.use_device(device):
            _, grad_w, grad_b = cupyconv.conv2d_backward(device.asarray(gy), device.asarray(x), device.asarray(w),
                                                         padding=1, needs=("weight", "bias"),
                                                         algorithm="implicit_gemm")
        want = cupyconv.conv2d_backward(gy.astype(numpy.float64), x.astype(numpy.float64), w.astype(numpy.float64),
                                        padding=1, needs=("weight", "bias"))
        ref.assert_close(device.asnumpy(grad_w), want[1], "float16", f"stream {key}")
        ref.assert_close(device.asnumpy(grad_b), want[2], "float16", f"stream {key}")
        assert set(device._arrivals) == ({"a"} if key == "a" and counted["replayed"] == 0 else {"a", "b"})
    assert counted == {"recorded": 1, "replayed": 2}
    assert all(not device.asnumpy(a).any() for a in device._arrivals.values())


def test_a_replay_launches_as_prepared(device, counted, monkeypatch):
    """A recorded launch is prepared once (`CudaDevice.launch_prepare`): a replay calls the kernel's per-device
    Function (`RawKernel.kernel`) with the scalars CuPy would wrap on every launch already wrapped, without
    looking the kernel up (`function`) or wrapping a scalar again -- and its results stay right."""
    (x2, w2, b2), second = conv2d_arrays(device, 14, "float16", groups=1)
    _, first = conv2d_arrays(device, 15, "float16", groups=1)
    wrapped = []
    packed = _device._packed
    monkeypatch.setattr(_device, "_packed", lambda args: wrapped.append(len(args)) or packed(args))
    with _device.use_device(device):
        cupyconv.conv2d(*first, padding=1)
        assert wrapped and counted == {"recorded": 1, "replayed": 0}
        (program,) = filter(None, _replay.CACHE.values())
        launches = [step for step in program.steps if step[0] == "launch_run"]
        assert len(launches) == len(wrapped) and not any(step[0] == "launch" for step in program.steps)
        cscalar = _device._scalar_wrapper()
        for _, (prepared, args), *_ in launches:
            assert callable(prepared[0]) and type(prepared[1]) is tuple and type(prepared[2]) is tuple
            assert not any(isinstance(a, _device._SCALARS) for a in args)   # every scalar wrapped
            assert any(type(a) is cscalar for a in args)
        del wrapped[:]
        looked_up = []
        monkeypatch.setattr(device, "function", lambda *a: looked_up.append(a))
        y2 = cupyconv.conv2d(*second, padding=1)
    assert counted == {"recorded": 1, "replayed": 1} and wrapped == [] and looked_up == []
    ref.assert_close(device.asnumpy(y2), cupyconv.conv2d(x2, w2, b2, padding=1), "float16", "prepared")


def test_wrapped_scalars_hold_the_bytes_cupy_would_pass():
    """`_device._packed` wraps exactly what CuPy's launch would wrap (a NumPy or Python scalar), as CuPy wraps it:
    the value's own dtype and bytes (a Python int as int64, a float as float64, a bool as bool); an array, None and
    an already wrapped scalar are passed as they are."""
    import ctypes
    import cupy
    cscalar = _device._scalar_wrapper()
    array = cupy.ndarray((2,), numpy.float32, memptr=cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(1 << 40, 8, None, device_id=0), 0))
    values = (numpy.int32(-5), numpy.uint32(7), numpy.int64(1 << 40), numpy.float32(1.5), numpy.float64(-2.25),
              numpy.float16(3.0), numpy.bool_(True), 3, 2.5, True)
    wrapped = _device._packed(values + (None, array))
    assert type(wrapped) is tuple and wrapped[-2] is None and wrapped[-1] is array
    for value, w in zip(values, wrapped):
        assert type(w) is cscalar
        want = numpy.asarray(value).tobytes()   # a Python int, float, bool: int64, float64, bool, as NumPy makes them
        assert ctypes.string_at(w.ptr, len(want)) == want, value
        assert w.get_numpy_type() is numpy.asarray(value).dtype.type
    assert _device._packed(wrapped[:2]) == wrapped[:2]   # not wrapped twice: CuPy passes a CPointer as it is


def test_an_argument_without_elements_is_made_once(device, counted, monkeypatch):
    """The tensor-core forward's split-K workspace of no split (an array without elements): made once at recording
    and passed to every replay's launch as it is, its own allocation left out of the program; the replays' other
    arguments are their own."""
    def arrays(seed):   # 16 channels: the tensor-core forward (conv_fwd_igemm), no split of K
        return [device.asarray(a) for a in tca.inputs(seed, (2, 16, 9, 9), (16, 16, 3, 3), (16,), dtype="float16")]

    first = arrays(16)
    calls = [arrays(seed) for seed in (17, 18)]
    with _device.use_device(device):
        cupyconv.conv2d(*first, padding=1)
        (program,) = filter(None, _replay.CACHE.values())
        constants = [a for step in program.steps for t in step[1] if type(t) is tuple for a in t
                     if getattr(a, "size", 1) == 0]
        assert constants, "expected the forward's split-K workspace of no split"
        assert not any(type(r) is _replay.Ref and r.slot is None for step in program.steps
                       for t in step[1] for r in (t if type(t) is tuple else (t,)))
        assert not any(step[0] == "empty" and 0 in step[1][0] for step in program.steps)
        seen: list = []
        launch_run = device.launch_run
        monkeypatch.setattr(device, "launch_run", lambda prepared, args: seen.append(args) or launch_run(prepared, args))
        allocations = []
        empty = device.empty
        monkeypatch.setattr(device, "empty", lambda shape, dtype: allocations.append(shape) or empty(shape, dtype))
        for arrays in calls:
            cupyconv.conv2d(*arrays, padding=1)
    assert counted["replayed"] == 2
    assert not any(0 in shape for shape in allocations)
    empties = [[a for a in args if getattr(a, "size", 1) == 0] for args in seen]
    half = len(seen) // 2
    assert all(a is b for first_args, second_args in zip(empties[:half], empties[half:])
               for a, b in zip(first_args, second_args))
    for arrays, args in zip(calls, (seen[:half], seen[half:])):   # each replay reads its own input
        assert arrays[0].data.ptr in {a.data.ptr for launch in args for a in launch if getattr(a, "size", 0)}


def test_a_prepared_launch_opts_in_to_its_shared_memory(monkeypatch):
    """Above 48 KiB of dynamic shared memory a launch fails unless its kernel opted in: preparing the launch (the
    recording's, which every replay then repeats without a check) does it (the emulator models the attribute).
    The compiled kernel is the process's (another test may have opted it in already): its attribute is set back to
    the default for this test and restored after it."""
    fresh = CupyHostDevice()
    name, shared = "conv_fwd_igemm<__half, int, 256, 64, 4>", 81920   # r50-64's forward tile
    monkeypatch.setattr(fresh.function("implicit_gemm.cu", name), "max_dynamic_shared_size_bytes",
                        _device.DEFAULT_SHARED_LIMIT)
    assert fresh.function("implicit_gemm.cu", name).max_dynamic_shared_size_bytes < shared
    prepared, _ = fresh.launch_prepare("implicit_gemm.cu", name, (1,), (128,), (), shared)
    assert prepared[3] == shared
    assert fresh.function("implicit_gemm.cu", name).max_dynamic_shared_size_bytes >= shared


def test_a_prepared_launch_takes_the_current_stream_at_each_call(monkeypatch):
    """A prepared launch names no stream: CuPy's `Function.__call__` then launches on the stream current at that
    call (`_get_stream(None)`), as `RawKernel.__call__` did -- a program recorded on one stream replays on
    another's.  Grid and block go as tuples (Function declares them `tuple`)."""
    calls = []

    class FakeKernel:
        max_dynamic_shared_size_bytes = _device.DEFAULT_SHARED_LIMIT
        kernel = staticmethod(lambda *args, **kwargs: calls.append((args, kwargs)))

    fresh = CupyHostDevice()
    monkeypatch.setattr(fresh, "function", lambda source, name: FakeKernel())
    prepared, args = fresh.launch_prepare("unfold.cu", "k", [2], [32], [numpy.int32(3)], 0)
    fresh.launch_run(prepared, args)
    fresh.launch_run(prepared, args)
    assert len(calls) == 2
    for positional, keywords in calls:
        assert keywords == {} and len(positional) == 4   # (grid, block, args, shared_mem): stream left to CuPy
        assert positional[0] == (2,) and positional[1] == (32,) and positional[3] == 0
        assert positional[2] is args and type(args[0]) is _device._scalar_wrapper()


def test_a_calls_scratch_arrays_are_parts_of_one_allocation(device, counted, monkeypatch):
    """The tensor-core backward's scratch arrays (channels-last copies of x and grad_output, the weight gradient's
    split-K partials and sums: read by the call's own steps only) are taken from one allocation per group
    (`_replay._pooled`): each part with its recorded shape, strides and dtype, 256-byte aligned, none overlapping a
    live one; the replays allocate less than the recording, run the same launches and stay right."""
    def arrays(seed):
        host = tca.inputs(seed, (2, 16, 9, 7), (16, 16, 3, 3), (2, 16, 9, 7), dtype="float16")
        return host, [device.asarray(a) for a in host]

    allocations: list = []
    empty = device.empty
    monkeypatch.setattr(device, "empty", lambda shape, dtype: allocations.append(shape) or empty(shape, dtype))
    with _device.use_device(device):
        _, (x, w, gy) = arrays(30)
        cupyconv.conv2d_backward(gy, x, w, padding=1, algorithm="implicit_gemm")
        (program,) = filter(None, _replay.CACHE.values())
        parts = [step for step in program.steps if step[0] == "part"]
        assert len(parts) >= 2, "expected the backward's scratch arrays pooled"
        check_drops(program)
        for host, (x, w, gy) in (arrays(seed) for seed in (31, 32)):
            del allocations[:]
            got = cupyconv.conv2d_backward(gy, x, w, padding=1, algorithm="implicit_gemm")
            # one allocation per `empty` step: the arenas' and the arrays' left out of them, fewer than one per array
            assert len(allocations) == sum(step[0] == "empty" for step in program.steps)
            assert len({step[1][0].slot for step in parts}) < len(parts)
            want = cupyconv.conv2d_backward(*(a.astype(numpy.float64) for a in (host[2], host[0], host[1])),
                                            padding=1)
            for g, r in zip(got, want):
                ref.assert_close(device.asnumpy(g), r, "float16", "replayed, scratch pooled")
    assert counted["replayed"] == 2
    arenas: dict = {}
    for _, template, *_ in parts:
        part = template[0]
        assert part.offset % _replay.ALIGNMENT == 0
        arenas.setdefault(part.slot, []).append(
            (part.offset, part.offset + math.prod(part.shape) * part.dtype.itemsize))
    for spans in arenas.values():
        spans.sort()
        assert all(high <= low for (_, high), (low, _) in zip(spans, spans[1:])), "parts overlap"


def _steps(*steps):
    """A program's steps from (method, slots read or the shape of an `empty`, result) for `_replay._pooled`."""
    return [("empty", (shape, numpy.float32), result) if method == "empty" else
            (method, tuple(_replay.Ref(s, 0, (1,), (4,), numpy.dtype(numpy.float32), True) for s in shape), result)
            for method, shape, result in steps]


def test_scratch_is_pooled_only_where_the_peak_does_not_rise():
    """Two scratch arrays alive together share an allocation; one whose pooling would hold its memory over a later
    allocation it did not overlap (raising the call's peak) keeps its own; results and offers are never pooled."""
    steps = _steps(("empty", (100,), 1), ("empty", (10,), 2), ("launch_run", (0, 1, 2), None),
                   ("empty", (1000,), 3), ("launch_run", (1, 3), None))
    # slot 2 dies at the first launch, before slot 3 is made: pooled with slot 1 (alive until the second launch)
    # its 10 floats would be held over slot 3's allocation
    pooled, slots = _replay._pooled(steps, keep={3}, slots=4)
    assert (pooled, slots) == (steps, 4)
    # both read by the last launch: pooled
    steps = _steps(("empty", (100,), 1), ("empty", (10,), 2), ("launch_run", (0, 1, 2), None),
                   ("empty", (1000,), 3), ("launch_run", (1, 2, 3), None))
    pooled, slots = _replay._pooled(steps, keep={3}, slots=4)
    assert slots == 5 and [s[0] for s in pooled] == ["empty", "part", "part", "launch_run", "empty", "launch_run"]
    assert pooled[0][1] == (512 + 256, numpy.dtype(numpy.uint8)) and pooled[0][2] == 4
    assert [(p[1][0].slot, p[1][0].offset, p[1][0].shape, p[2]) for p in pooled[1:3]] == [(4, 0, (100,), 1),
                                                                                       (4, 512, (10,), 2)]
    assert _replay._peak(pooled, {3}) == _replay._peak(steps, {3})
    # a result (kept) is never a part, however it overlaps
    assert _replay._pooled(steps, keep={1, 3}, slots=4) == (steps, 4)


def test_a_scratch_array_left_alone_rides_in_a_results_allocation():
    """A scratch array no other could take joins a result's allocation, after it, while it is at most
    1/RESULT_SHARE of the result's bytes (in whole 256-byte blocks); an offer (not in `results`) never carries one,
    nor does a result too small."""
    steps = _steps(("empty", (64 * 128,), 3), ("empty", (100,), 5), ("empty", (1000,), 4),
                   ("launch_run", (0, 4, 5), None), ("launch_run", (4, 5, 3), None))
    pooled, slots = _replay._pooled(steps, keep={3, 4}, slots=6, results=frozenset({3}))
    assert slots == 7 and [s[0] for s in pooled] == ["empty", "part", "part", "empty", "launch_run", "launch_run"]
    assert pooled[0][1] == (32768 + 512, numpy.dtype(numpy.uint8))
    assert [(p[1][0].offset, p[2]) for p in pooled[1:3]] == [(0, 3), (32768, 5)]   # the result first
    assert _replay._peak(pooled, {3, 4}) <= _replay._peak(steps, {3, 4}) + 512
    assert _replay._pooled(steps, keep={3, 4}, slots=6) == (steps, 6)   # no result named: an offer, say
    small = _steps(("empty", (63 * 128,), 3), *[(m, s, r) for m, s, r in [("empty", (100,), 5),
                   ("empty", (1000,), 4), ("launch_run", (0, 4, 5), None), ("launch_run", (4, 5, 3), None)]])
    assert _replay._pooled(small, keep={3, 4}, slots=6, results=frozenset({3})) == (small, 6)


def test_a_forwards_weight_copy_rides_in_its_output(device, counted, monkeypatch):
    """The tensor-core forward's scratch (the weight in channels-last order) in the output's allocation (its share
    allowed here at any size): the output at the start of it, right on every replay, one allocation fewer."""
    monkeypatch.setattr(_replay, "RESULT_SHARE", 1)
    allocations: list = []
    empty = device.empty
    monkeypatch.setattr(device, "empty", lambda shape, dtype: allocations.append(shape) or empty(shape, dtype))
    with _device.use_device(device):
        for seed in (40, 41, 42):
            host = tca.inputs(seed, (2, 16, 12, 12), (16, 16, 3, 3), (16,), dtype="float16")   # y as big as w
            arrays = [device.asarray(a) for a in host]
            del allocations[:]
            y = cupyconv.conv2d(*arrays, padding=1, algorithm="implicit_gemm")
            want = cupyconv.conv2d(*(a.astype(numpy.float64) for a in host), padding=1)
            ref.assert_close(device.asnumpy(y), want, "float16", "replayed, the weight copy in the output's memory")
            if seed > 40:
                (program,) = filter(None, _replay.CACHE.values())
                assert len(allocations) == sum(step[0] == "empty" for step in program.steps)
                assert y.data.ptr == y.data.mem.ptr and y.data.mem.size > y.nbytes
    parts = [step for step in program.steps if step[0] == "part"]
    assert len(parts) == 2 and parts[0][1][0].offset == 0 and parts[1][1][0].offset >= y.nbytes
    assert counted["replayed"] == 2


def test_the_replay_switch_reads_the_environment_at_each_call(monkeypatch):
    """`enabled` reads os.environ's own dict (probed once): a change made through os.environ shows at the next call;
    an environ without that dict (another Python) is read through its `get`."""
    monkeypatch.delenv("CUPYCONV_REPLAY", raising=False)
    assert _replay.enabled()
    monkeypatch.setenv("CUPYCONV_REPLAY", "0")
    assert not _replay.enabled()
    monkeypatch.setenv("CUPYCONV_REPLAY", "1")
    assert _replay.enabled()
    plain = {"CUPYCONV_REPLAY": "0"}
    enabled = _replay._reads_environ(plain)
    assert not enabled()
    plain["CUPYCONV_REPLAY"] = "yes"
    assert enabled()
