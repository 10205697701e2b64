"""cupyconv.settings: every setting's getter, setter and context manager, their scoping across threads, and
what the ops read from them (the workspace limit chunks, deterministic turns autotuning off)."""
import re
import threading

import numpy
import pytest

import cupyconv
from cupyconv import _autotune, _device, settings
from emulator import EmulatedDevice

FLAGS = ("allow_tf32", "autotune", "deterministic")


def accessors(name):
    return getattr(settings, f"get_{name}"), getattr(settings, f"set_{name}"), getattr(settings, name)


@pytest.mark.parametrize("name", FLAGS)
def test_flag_default_setter_and_scope(name):
    get, set_, scope = accessors(name)
    assert get() is False
    with scope(True):
        assert get() is True
        with scope(False):
            assert get() is False
        assert get() is True
    assert get() is False
    set_(True)
    try:
        assert get() is True
        with scope(False):
            assert get() is False
        assert get() is True
    finally:
        set_(False)
    assert get() is False


def test_scope_is_restored_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with settings.autotune(True):
            raise RuntimeError("inside")
    assert settings.get_autotune() is False


def test_workspace_limit_default_setter_and_scope():
    assert settings.get_workspace_limit() == settings.DEFAULT_WORKSPACE_LIMIT
    with settings.workspace_limit(1234):
        assert settings.get_workspace_limit() == 1234
    settings.set_workspace_limit(4096)
    try:
        assert settings.get_workspace_limit() == 4096
    finally:
        settings.set_workspace_limit(settings.DEFAULT_WORKSPACE_LIMIT)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1", True, None])
def test_workspace_limit_rejects_what_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="workspace limit must be a positive number of bytes"):
        settings.set_workspace_limit(bad)
    with pytest.raises(ValueError, match="workspace limit"):
        with settings.workspace_limit(bad):
            pass
    assert settings.get_workspace_limit() == settings.DEFAULT_WORKSPACE_LIMIT


@pytest.mark.parametrize("bad", ["False", "no", 0, 1, 0.5, None, [True]])
@pytest.mark.parametrize("name", FLAGS)
def test_flags_refuse_what_is_not_a_bool(name, bad):
    """bool() would read 'False' as True: like torch.backends.cudnn, only a bool is taken (NumPy's too)."""
    get, set_, scope = accessors(name)
    with pytest.raises(TypeError, match=rf"^{name} must be a bool \(True or False\), got {re.escape(repr(bad))}$"):
        set_(bad)
    with pytest.raises(TypeError, match=rf"^{name} must be a bool"):
        with scope(bad):
            pass
    assert get() is False
    with scope(numpy.bool_(True)):
        assert get() is True
    set_(numpy.True_)
    try:
        assert get() is True
    finally:
        set_(False)


@pytest.mark.parametrize("name", [*FLAGS, "workspace_limit"])
def test_a_scope_in_one_thread_is_invisible_to_another(name):
    get, _, scope = accessors(name)
    value = 777 if name == "workspace_limit" else True
    inside, seen = threading.Event(), []

    def other():
        inside.wait(5)
        seen.append(get())

    thread = threading.Thread(target=other)
    thread.start()
    with scope(value):
        inside.set()
        thread.join(5)
        assert get() == value
    assert seen == [settings.DEFAULT_WORKSPACE_LIMIT if name == "workspace_limit" else False]


def test_top_level_names_are_the_settings_module():
    for name in ("set_allow_tf32", "get_allow_tf32", "set_autotune", "get_autotune", "set_deterministic",
                 "get_deterministic", "set_workspace_limit", "get_workspace_limit", "workspace_limit"):
        assert getattr(cupyconv, name) is getattr(settings, name)
    assert cupyconv.settings is settings


class TimingRecorder(EmulatedDevice):
    """Counts Device.timed calls: autotuning times candidates, the heuristic never does."""

    def __init__(self):
        super().__init__()
        self.timings = 0

    def timed(self, run):
        self.timings += 1
        return super().timed(run)


def test_deterministic_wins_over_autotune(monkeypatch):
    monkeypatch.setattr(_autotune, "CACHE", {})
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 6))
    weight = rng.standard_normal((4, 3, 3, 3))
    device = TimingRecorder()
    with _device.use_device(device), settings.autotune(True):
        with settings.deterministic(True):
            cupyconv.conv2d(x, weight, padding=1)
        assert device.timings == 0 and not _autotune.CACHE
        cupyconv.conv2d(x, weight, padding=1)
    assert device.timings == 3 and len(_autotune.CACHE) == 1  # both candidates timed (the heuristic's twice), cached


def test_autotuning_keeps_tf32_and_strict_float32_apart(monkeypatch):
    """float32 with TF32 allowed has the tensor-core candidate; a choice made under TF32 must never be reused
    for strict float32 (where that candidate cannot run), nor the other way round."""
    monkeypatch.setattr(_autotune, "CACHE", {})
    rng = numpy.random.default_rng(2)
    x = rng.standard_normal((2, 16, 7, 6)).astype(numpy.float32)
    weight = rng.standard_normal((16, 16, 3, 3)).astype(numpy.float32)
    with _device.use_device(EmulatedDevice()), settings.autotune(True):
        with settings.allow_tf32(True):
            cupyconv.conv2d(x, weight, padding=1)
        cupyconv.conv2d(x, weight, padding=1)
    keys = list(_autotune.CACHE)
    assert len(keys) == 2 and {k[3] for k in keys} == {True, False}
    assert _autotune.CACHE[next(k for k in keys if not k[3])] != "implicit_gemm"


def test_the_scoped_workspace_limit_chunks_the_im2col_buffer():
    """conv2d's GEMM path reads the limit through settings: one image's columns per chunk here."""
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((3, 20, 6, 5))
    weight = rng.standard_normal((20, 20, 3, 3))
    spec_cols = 20 * 9 * 4 * 3 * 8  # C * taps * out pixels * itemsize
    launches = []

    class Recorder(EmulatedDevice):
        def launch(self, source, name, *args, **kwargs):
            launches.append(name)
            super().launch(source, name, *args, **kwargs)

    with _device.use_device(Recorder()):
        whole = cupyconv.conv2d(x, weight, algorithm="im2col_gemm")
        assert sum(n.startswith("unfold_im2col") for n in launches) == 1
        launches.clear()
        with settings.workspace_limit(spec_cols):
            chunked = cupyconv.conv2d(x, weight, algorithm="im2col_gemm")
    assert sum(n.startswith("unfold_im2col") for n in launches) == 3
    numpy.testing.assert_array_equal(chunked, whole)
