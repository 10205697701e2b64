"""Where and how the GPU path runs: on the arrays' device, on torch's stream and allocator for torch tensors, never
under CUDA graph capture, and only with CuPy's own CUDA toolkit.

No GPU here: every CuPy call that needs a driver (`cupy.cuda.Device`, the current stream, the capture query, the
version queries) and torch's `cuda_context` are RECORDED FAKES, monkeypatched for one test, that log what the
code asked for.  The arrays are real `cupy.ndarray` objects over host memory (`UnownedMemory` with a device id),
so CuPy's own `device` attribute is what the code reads.  What a real GPU must still confirm is listed in
docs/architecture.md ("Device and stream").
"""
from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import numpy
import pytest

cupy = pytest.importorskip("cupy")

import cupyconv  # noqa: E402
from cupyconv import _arrays, _device, _fastpath, _replay  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def host_cupy(shape, device_id: int, dtype=numpy.float32):
    """A real cupy.ndarray over host memory that CuPy believes lives on device `device_id` (never launched on)."""
    host = numpy.random.default_rng().standard_normal(shape).astype(dtype)
    memory = cupy.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=device_id)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


class Recorder:
    """The log the fakes write to, in call order."""

    def __init__(self):
        self.events: list = []
        self.capturing = False
        self.capture_error = None

    def fake_device(self, device_id):
        recorder = self

        class FakeDevice:   # the fake of cupy.cuda.Device(id) as a context manager
            def __enter__(self):
                recorder.events.append(("enter device", device_id))

            def __exit__(self, *exc):
                recorder.events.append(("exit device", device_id))

        return FakeDevice()

    def fake_stream_is_capturing(self, ptr):
        self.events.append(("capture query", ptr))
        if self.capture_error is not None:
            raise self.capture_error
        return self.capturing


class FakeStream:
    ptr = 0x5EED


@pytest.fixture
def recorder(monkeypatch):
    """Fakes for the driver calls of `CudaDevice.scope`, recording into one log."""
    log = Recorder()
    monkeypatch.setattr(cupy.cuda, "Device", log.fake_device)
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda *a: FakeStream())
    monkeypatch.setattr(cupy.cuda.runtime, "streamIsCapturing", log.fake_stream_is_capturing)
    return log


@_arrays.on_arrays_device
def probe(recorder, op="probe_op", **arrays):
    """A public entry point in miniature: a Call, then 'GPU work' that records when it runs."""
    call = _arrays.Call(op, **arrays)
    recorder.events.append(("gpu work", call.op))
    return call


def test_gpu_path_runs_inside_the_arrays_device(recorder):
    """CuPy arrays on device 1: the call enters cupy.cuda.Device(1) (fake) before its work, checks capture on the
    current stream, and leaves the device when the entry point returns."""
    x, w = host_cupy((2, 3, 5, 5), 1), host_cupy((4, 3, 3, 3), 1)
    call = probe(recorder, x=x, weight=w)
    assert isinstance(call.device, _device.CudaDevice) and call.xp is cupy
    assert recorder.events == [("enter device", 1), ("capture query", FakeStream.ptr), ("gpu work", "probe_op"),
                               ("exit device", 1)]


@pytest.mark.parametrize("capturing", [False, True])
def test_a_repeated_call_enters_the_device_and_queries_capture_too(recorder, monkeypatch, capturing):
    """The fast path of a repeated call (`_fastpath.lookup`) runs its program inside CudaDevice.scope: the arrays'
    device entered, the capture query made (and a capture refused) before the replay, the device left after."""
    x = host_cupy((2, 3, 5, 5), 1)
    recorder.capturing = capturing

    class FakeProgram:
        def run(self, device, arrays):
            recorder.events.append(("replay", arrays[0] is x))
            return "y"

    monkeypatch.setattr(_replay, "CACHE", {"replay key": FakeProgram()})
    monkeypatch.setattr(_fastpath, "CACHE", {"signature": _fastpath.Entry(_device.CudaDevice(), "fake_op", 1,
                                                                          "replay key", (0,))})
    if capturing:
        with pytest.raises(RuntimeError, match="^fake_op: cupyconv cannot run while the current CUDA stream"):
            _fastpath.lookup("signature", (x,), {})
        assert [e[0] for e in recorder.events] == ["enter device", "capture query", "exit device"]
    else:
        assert _fastpath.lookup("signature", (x,), {}) == "y"
        assert recorder.events == [("enter device", 1), ("capture query", FakeStream.ptr), ("replay", True),
                                   ("exit device", 1)]


def test_device_context_is_left_when_the_call_raises(recorder):
    @_arrays.on_arrays_device
    def failing(x):
        _arrays.Call("failing_op", x=x)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        failing(host_cupy((1, 1, 2, 2), 2))
    assert recorder.events[0] == ("enter device", 2) and recorder.events[-1] == ("exit device", 2)


def test_numpy_arrays_enter_no_gpu_context(recorder):
    probe(recorder, x=numpy.zeros((1, 1, 2, 2), numpy.float32))
    assert recorder.events == [("gpu work", "probe_op")]


def test_mixed_devices_are_refused_before_any_gpu_context(recorder):
    x, w = host_cupy((2, 3, 5, 5), 0), host_cupy((4, 3, 3, 3), 1)
    with pytest.raises(TypeError, match=r"conv2d: x is a cupy.ndarray on cuda:0 but weight is a cupy.ndarray on "
                                        r"cuda:1; all arrays of one call must be of one kind on one device"):
        cupyconv.conv2d(x, w)
    assert recorder.events == []


@pytest.mark.parametrize("capturing, error", [(True, None), (False, "implicit"), (False, "invalidated")])
def test_stream_capture_is_refused_before_any_work(recorder, capturing, error):
    """While the current stream captures a CUDA graph (or the query says launching would break a capture), the
    call stops with an error naming the op and what to use, before any GPU work or autotuning."""
    recorder.capturing = capturing
    if error == "implicit":
        recorder.capture_error = cupy.cuda.runtime.CUDARuntimeError(906)   # cudaErrorStreamCaptureImplicit
    elif error == "invalidated":
        recorder.capture_error = RuntimeError("the stream was capturing, but an error has invalidated the capture "
                                              "sequence")
    with pytest.raises(RuntimeError, match=r"^conv2d: cupyconv cannot run while the current CUDA stream captures"
                                           r".*reduce-overhead.*max-autotune-no-cudagraphs"):
        cupyconv.conv2d(host_cupy((2, 3, 5, 5), 0), host_cupy((4, 3, 3, 3), 0))
    assert [e[0] for e in recorder.events] == ["enter device", "capture query", "exit device"]


def test_other_capture_query_errors_are_not_taken_for_capture(recorder):
    recorder.capture_error = cupy.cuda.runtime.CUDARuntimeError(35)   # cudaErrorInsufficientDriver
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorInsufficientDriver"):
        probe(recorder, x=host_cupy((1, 1, 2, 2), 0))


def test_plain_api_on_torch_cuda_tensors_uses_cupyconv_torchs_context(recorder, monkeypatch):
    """A torch CUDA tensor (a fake: a CPU tensor whose `device` says cuda:1) given to the plain API: the call runs
    inside `cupyconv.torch.cuda.cuda_context` (faked here; the one mechanism that makes torch's current stream
    CuPy's and allocates from torch's caching allocator), entered before the tensor is imported through DLPack,
    then the executor's scope on the same device."""
    torch = pytest.importorskip("torch")
    from cupyconv.torch import cuda as torch_cuda

    class FakeCudaTensor(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", 1)

    FakeCudaTensor.__module__ = "torch.fake_cuda_for_tests"   # what `_arrays._kind` reads

    @contextlib.contextmanager
    def fake_cuda_context(device):
        recorder.events.append(("enter torch context", str(device)))
        yield
        recorder.events.append(("exit torch context", str(device)))

    def fake_from_dlpack(t):
        recorder.events.append(("import", tuple(t.shape)))
        return host_cupy(tuple(t.shape), 1)

    monkeypatch.setattr(torch_cuda, "cuda_context", fake_cuda_context)
    monkeypatch.setattr(cupy, "from_dlpack", fake_from_dlpack)
    x = torch.zeros(2, 3, 4, 4).as_subclass(FakeCudaTensor)
    probe(recorder, x=x)
    assert recorder.events == [("enter torch context", "cuda:1"), ("enter device", 1),
                               ("capture query", FakeStream.ptr), ("import", (2, 3, 4, 4)),
                               ("gpu work", "probe_op"), ("exit device", 1), ("exit torch context", "cuda:1")]


def test_every_call_site_of_the_ops_runs_in_a_device_scope():
    """Each function of cupyconv/ops that builds a `Call` is decorated with `on_arrays_device`: without it, the
    Call would enter no device context and the work would run on CuPy's current device."""
    missing, found = [], 0
    for path in sorted((ROOT / "cupyconv" / "ops").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            builds_call = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Call"
                              for n in ast.walk(node))
            if builds_call:
                found += 1
                if "on_arrays_device" not in {getattr(d, "id", None) for d in node.decorator_list}:
                    missing.append(f"{path.name}:{node.name}")
    assert found >= 12 and not missing, missing


def test_kernel_loader_checks_cupys_toolkit_before_compiling(monkeypatch):
    """`_cuda_function_on` (the per-device kernel memo) runs `check_cupy_toolkit` before it builds a RawModule
    (a fake that records)."""
    built = []
    monkeypatch.setattr(cupy, "RawModule", lambda **kw: built.append(kw))

    def refuse():
        raise RuntimeError("toolkit mismatch")

    monkeypatch.setattr(_device, "check_cupy_toolkit", refuse)
    _device._cuda_function_on.cache_clear()
    with pytest.raises(RuntimeError, match="toolkit mismatch"):
        _device._cuda_function_on(0, "unfold.cu", _device.all_instantiations()[0][1])
    assert built == []


@pytest.mark.parametrize("runtime, nvrtc, headers, message", [
    (12090, (12, 9), 12090, None),
    (13000, (13, 0), None, None),
    (12090, (13, 5), 12090, r"built for CUDA 12 but would compile the kernels with NVRTC 13\.5"),
    (12090, (12, 9), 13050, r"built for CUDA 12 but would compile the kernels with CUDA 13 headers in "),
])
def test_check_cupy_toolkit(monkeypatch, tmp_path, runtime, nvrtc, headers, message):
    """Fakes for CuPy's version queries and for the header directory cuda-pathfinder gives CuPy."""
    monkeypatch.setattr(cupy.cuda.runtime, "runtimeGetVersion", lambda: runtime)
    monkeypatch.setattr(cupy.cuda.nvrtc, "getVersion", lambda: nvrtc)
    include = None
    if headers is not None:
        include = tmp_path / "include"
        include.mkdir()
        (include / "cuda_runtime_api.h").write_text(f"#pragma once\n#define CUDART_VERSION  {headers}\n")
    monkeypatch.setattr(_device, "_cupy_header_dir", lambda: None if include is None else str(include))
    _device.check_cupy_toolkit.cache_clear()
    try:
        if message is None:
            _device.check_cupy_toolkit()
        else:
            with pytest.raises(RuntimeError, match=message + r".*shadow CuPy's own.*cupyconv\[cuda12\]"):
                _device.check_cupy_toolkit()
    finally:
        _device.check_cupy_toolkit.cache_clear()


def test_custom_ops_are_tagged_cudagraph_unsafe():
    """torch.compile(mode='reduce-overhead') runs ops with this tag outside its CUDA graphs (real torch ops)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        pytest.skip(f"torch {torch.__version__} has no cudagraph_unsafe tag")
    import cupyconv.torch  # noqa: F401  (registers the ops)
    names = [n for n in dir(torch.ops.cupyconv) if not n.startswith("_")]
    ops = [getattr(torch.ops.cupyconv, n) for n in names]
    ops = [op for op in ops if hasattr(op, "default")]
    assert len(ops) >= 20, names
    untagged = [str(op) for op in ops if torch.Tag.cudagraph_unsafe not in op.default.tags]
    assert not untagged, untagged


def test_cudnn_copies_its_result_on_the_arrays_device(recorder, monkeypatch):
    """cupyconv.cudnn writes the op's result into the caller's output inside the output's device scope
    (`CudaDevice.scope`, its driver calls faked by the recorder; the copy itself recorded); NumPy outputs need none."""
    from cupyconv import cudnn

    class RecordingCopies(_device.CudaDevice):
        def copyto(self, dst, src):
            recorder.events.append(("copy",))

    original = cudnn._array_work
    monkeypatch.setattr(cudnn, "_array_work", lambda a: RecordingCopies() if isinstance(a, cupy.ndarray)
                        else original(a))
    out = host_cupy((2, 2), 1)
    cudnn._copy_into(out, out, out)
    assert recorder.events == [("enter device", 1), ("capture query", FakeStream.ptr), ("copy",), ("exit device", 1)]
    recorder.events.clear()
    target, result = numpy.zeros(2), numpy.arange(2.0)
    cudnn._copy_into(target, target, result)
    assert recorder.events == [] and (target == result).all()
    source = (ROOT / "cupyconv" / "cudnn.py").read_text()
    assert source.count("_copy_into(") == 4 and "[...] = " not in source   # the definition and the three outputs


def test_torch_cuda_context_keeps_one_stream_and_allocator_per_device_and_stream(monkeypatch):
    """cupyconv.torch.cuda_context reuses the CuPy stream object and allocator it made for a (device, torch stream)
    and never uses them for another device or stream; a nested context for the same device and stream sets up
    nothing.  Recorded fakes for torch's current stream handle, cupy.cuda.Device, the CuPy stream object and the
    allocator (each made object labelled with what it was made for)."""
    torch = pytest.importorskip("torch")
    from cupyconv.torch import cuda as torch_cuda
    log: list = []
    current = {}   # device index -> torch's current stream handle

    class Labelled:
        def __init__(self, kind, *label):
            self.kind, self.label = kind, label

        def __enter__(self):
            log.append(("enter", self.kind, *self.label))

        def __exit__(self, *exc):
            log.append(("exit", self.kind, *self.label))

    monkeypatch.setattr(torch_cuda, "_raw_stream", lambda index: current[index])
    monkeypatch.setattr(cupy.cuda, "Device", lambda index: Labelled("device", index))
    monkeypatch.setattr(torch_cuda, "_cupy_stream", lambda cupy, s: Labelled("stream", s.device_index, s.cuda_stream))
    monkeypatch.setattr(torch_cuda, "_torch_allocator", lambda cupy, handle: ("allocator", handle))
    monkeypatch.setattr(cupy.cuda, "using_allocator", lambda allocator: Labelled(*allocator))
    monkeypatch.setattr(torch_cuda, "_PER_STREAM", {})
    made = []
    real_stream = torch_cuda._cupy_stream
    monkeypatch.setattr(torch_cuda, "_cupy_stream", lambda cupy, s: made.append((s.device_index, s.cuda_stream))
                        or real_stream(cupy, s))

    def enter(index, stream):
        current[index] = stream
        log.clear()
        with torch_cuda.cuda_context(torch.device("cuda", index)):
            log.append(("work",))
        return log[:]

    def expected(index, stream):
        return [("enter", "device", index), ("enter", "allocator", stream), ("enter", "stream", index, stream),
                ("work",), ("exit", "stream", index, stream), ("exit", "allocator", stream), ("exit", "device", index)]

    for index, stream in ((0, 0xA), (0, 0xB), (1, 0xA), (0, 0xA), (1, 0xA), (0, 0xB)):
        assert enter(index, stream) == expected(index, stream), (index, stream)
    assert made == [(0, 0xA), (0, 0xB), (1, 0xA)]   # one stream object each, made once
    current[0] = 0xA
    log.clear()
    with torch_cuda.cuda_context(torch.device("cuda", 0)):
        with torch_cuda.cuda_context(torch.device("cuda", 0)):   # nested, same device and stream: nothing again
            log.append(("work",))
        current[0] = 0xB   # the stream changed inside: a nested context sets it up
        with torch_cuda.cuda_context(torch.device("cuda", 0)):
            log.append(("work on B",))
    assert log == [*expected(0, 0xA)[:3], ("work",), *expected(0, 0xB)[:3], ("work on B",),
                   *expected(0, 0xB)[4:], *expected(0, 0xA)[4:]]
    with torch_cuda.cuda_context(torch.device("cpu")):   # not a CUDA device: nothing
        pass
    # No index: torch's current device when the block is entered (not when the context is made)
    context = torch_cuda.cuda_context(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    log.clear()
    with context:
        log.append(("work",))
    assert log == expected(1, 0xA)
