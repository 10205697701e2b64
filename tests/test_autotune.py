"""Autotuning times the GPU, not the host (cupyconv/_autotune.py `gpu_time`, `CudaDevice.timed`).

No GPU here: `SimulatedGpu` is a `CudaDevice` whose CUDA events and stream are a simulated timeline.  The host's
clock advances by what each call costs the host; each piece of GPU work starts when the GPU is free and the host
has enqueued it, so on an idle stream the GPU waits for the host, as a real one does.  The timing loop and
`CudaDevice.launch` of the spin kernel run unchanged on it.  The emulator runs the spin kernel itself.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy
import pytest

import cupyconv
from cupyconv import _autotune, _device, settings
from emulator import CupyHostDevice, EmulatedDevice

US = 1e-6


class Timeline:
    """The host's clock (`now`) and one GPU stream (`gpu_free`: when the GPU has done all it was given)."""

    def __init__(self):
        self.now = 0.0
        self.gpu_free = 0.0

    def host(self, seconds: float) -> None:
        self.now += seconds

    def gpu(self, seconds: float) -> None:
        """Enqueue GPU work now: it starts when the GPU is free, or now if the GPU is idle (waiting for the host)."""
        self.gpu_free = max(self.gpu_free, self.now) + seconds

    def synchronize(self) -> None:
        self.now = max(self.now, self.gpu_free)


class SimulatedEvent:
    """cupy.cuda.Event on the timeline: it completes when the GPU reaches it."""

    def __init__(self, timeline: Timeline):
        self.timeline, self.time = timeline, None

    def record(self) -> None:
        self.time = max(self.timeline.gpu_free, self.timeline.now)
        self.timeline.gpu_free = self.time

    @property
    def done(self) -> bool:
        return self.timeline.now >= self.time

    def synchronize(self) -> None:
        self.timeline.now = max(self.timeline.now, self.time)


class SimulatedSpin:
    """CuPy's RawKernel for timing_spin (what CudaDevice.launch calls): cycles / clock_rate seconds of GPU work."""
    max_dynamic_shared_size_bytes = _device.DEFAULT_SHARED_LIMIT

    def __init__(self, device: "SimulatedGpu", source: str, name: str):
        assert (source, name) in _device.all_instantiations()
        self.device = device

    def __call__(self, grid, block, args, *, shared_mem=0):
        (cycles,) = args
        assert type(cycles) is numpy.int64 and grid == (1,) and block == (1,)   # `long long cycles`, one thread
        self.device.spins.append(int(cycles) / self.device.clock_rate)
        self.device.timeline.host(5 * US)   # a launch costs the host too
        self.device.timeline.gpu(int(cycles) / self.device.clock_rate)


class SimulatedGpu(_device.CudaDevice):
    """CudaDevice with a simulated stream: its timed, launch and events logic runs as on a GPU."""
    name = "simulated"
    clock_rate = 1_500_000_000

    def __init__(self):
        self.timeline = Timeline()
        self.spins: list[float] = []
        self.xp = SimpleNamespace(cuda=SimpleNamespace(
            Event=lambda: SimulatedEvent(self.timeline),
            get_elapsed_time=lambda start, stop: (stop.time - start.time) * 1e3))   # milliseconds, as CuPy

    def function(self, source, name):
        return SimulatedSpin(self, source, name)

    def key(self):
        return (self.name, id(self))

    def call(self, launches: int, host_s: float, gpu_s: float) -> None:
        """One call of an op: `launches` launches, each after host_s / launches of Python, of gpu_s / launches each."""
        for _ in range(launches):
            self.timeline.host(host_s / launches)
            self.timeline.gpu(gpu_s / launches)


@pytest.fixture
def gpu(monkeypatch):
    device = SimulatedGpu()
    monkeypatch.setattr(_autotune, "host_clock", lambda: device.timeline.now)
    monkeypatch.setattr(_autotune, "CACHE", {})
    monkeypatch.setattr(_autotune, "MEASURED", {})
    return device


# r50-64 float16 as measured on the H200 (benchmarks/results/gpu-2026-11-26): the implicit GEMM, 3 launches and
# 47 us of kernels, against conv_fwd_direct, one launch of 529 us; the host cost of each as a parameter.
CANDIDATES = {"direct": (1, 529 * US), "implicit_gemm": (3, 47 * US)}


@pytest.mark.parametrize("host_us", [(150, 800), (800, 150), (1500, 1500), (5, 20)])
def test_autotune_picks_by_gpu_time_whatever_the_host_costs(gpu, host_us):
    host = dict(zip(CANDIDATES, (h * US for h in host_us)))

    def run(algorithm):
        launches, gpu_s = CANDIDATES[algorithm]
        gpu.call(launches, host[algorithm], gpu_s)
        return algorithm

    with settings.autotune(True):
        result = _autotune.resolve(gpu, ("r50-64",), "auto", tuple(CANDIDATES), "direct", run)
    assert result == "implicit_gemm" and list(_autotune.CACHE.values()) == ["implicit_gemm"]
    for algorithm, (launches, gpu_s) in CANDIDATES.items():
        seconds, got = gpu.timed(lambda: run(algorithm))
        assert got == algorithm and seconds == pytest.approx(gpu_s, rel=1e-9)   # the kernels' time exactly


def test_a_spin_too_short_is_doubled_and_the_repetition_made_again(gpu):
    """The untimed call costs the host 10 us, the timed ones 1 ms (e.g. a cold cache): the first spin (100 us,
    SPIN_MIN_S) cannot cover them, and the events would time the host; each repetition is made again with twice
    the spin until one covers the enqueue."""
    host_costs = iter([10 * US] + [1000 * US] * 100)

    def run():
        gpu.call(4, next(host_costs), 60 * US)
        return "out"

    seconds, result = gpu.timed(run)
    assert result == "out" and seconds == pytest.approx(60 * US, rel=1e-9)
    assert gpu.spins == pytest.approx([100 * US, 200 * US, 400 * US, 800 * US] + [1600 * US] * _autotune.REPEATS)


@pytest.mark.parametrize("host_us, first_spin_us", [(1, 100), (400, 800), (2000, 4000), (10000, 5000)])
def test_the_first_spin_is_sized_from_the_host_time_and_capped(gpu, host_us, first_spin_us):
    def run():
        gpu.call(2, host_us * US, 30 * US)

    seconds, _ = gpu.timed(run)
    assert gpu.spins[0] == pytest.approx(first_spin_us * US)
    assert seconds == pytest.approx(30 * US, rel=1e-9)


def test_a_call_that_waits_for_the_gpu_ends_at_the_longest_spin(gpu):
    """A call that synchronises can never be covered: the spin stops growing at SPIN_MAX_S and the repetitions
    then count what the events measured (here the spin's remainder is not in it: the host waited it out)."""
    def run():
        gpu.call(1, 20 * US, 100 * US)
        gpu.timeline.synchronize()

    seconds, _ = gpu.timed(run)
    growing, at_cap = gpu.spins[:-_autotune.REPEATS], gpu.spins[-_autotune.REPEATS:]
    assert growing[0] == pytest.approx(2 * 120 * US)   # the untimed call took 120 us of host time, waiting included
    assert all(b == pytest.approx(2 * a) for a, b in zip(growing, growing[1:])) and growing[-1] < _autotune.SPIN_MAX_S
    assert at_cap == [_autotune.SPIN_MAX_S] * _autotune.REPEATS
    assert seconds == pytest.approx(100 * US, rel=1e-9)


def test_timed_is_the_median_of_the_repetitions(gpu):
    gpu_us = iter([999, 40, 10, 30, 999])   # the untimed call, three repetitions, and one more that is not made

    def run():
        gpu.call(1, 50 * US, next(gpu_us) * US)

    assert gpu.timed(run)[0] == pytest.approx(30 * US, rel=1e-9)
    assert next(gpu_us) == 999


def test_the_spin_kernel_spins_for_its_cycles_on_the_emulator():
    """_autotune.spin through CudaDevice.launch, CuPy's RawKernel interface and the emulator (CupyHostDevice): the
    emulated SM clock is 1 GHz of host time, so 20 ms of spin take 20 ms of wall time."""
    device = CupyHostDevice()
    _autotune.spin(device, 1 * US)   # compiles timing.cu (cached)
    for seconds in (0.0, 0.02):
        begin = time.perf_counter()
        _autotune.spin(device, seconds)
        elapsed = time.perf_counter() - begin
        assert seconds <= elapsed < seconds + 1.0
    assert device.launches[-1] == "timing_spin<float, int>"


def test_the_emulator_clock_counts_nanoseconds():
    """clock64() on the emulator: the kernel spins while 5 ms of the host's clock pass, however often it reads it."""
    device = EmulatedDevice()
    _autotune.spin(device, 1 * US)
    begin = time.perf_counter()
    _autotune.spin(device, 5e-3)
    assert 5e-3 <= time.perf_counter() - begin < 1.0


# ---------------------------------------------------------------------------------------------------------
# On a GPU (pytest -m gpu): what the simulation assumes about CUDA events and the spin, and the case that was wrong


@pytest.mark.gpu
def test_gpu_time_leaves_the_host_out_on_a_gpu(capsys):
    """Two spins of 100 us (at the peak clock), each behind a millisecond of host time: plain events around the
    call time the host (over 2 ms); gpu_time gives what it gives for the same spins without the host's time."""
    import cupy
    device = _device.CudaDevice()

    def spins(host_s):
        def run():
            for _ in range(2):
                time.sleep(host_s)
                _autotune.spin(device, 100 * US)
        return run

    slow_host, no_host = spins(1e-3), spins(0.0)
    slow_host()   # compiles timing.cu
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    slow_host()
    stop.record()
    stop.synchronize()
    plain = cupy.cuda.get_elapsed_time(start, stop) / 1e3
    seconds, fast = device.timed(slow_host)[0], device.timed(no_host)[0]
    with capsys.disabled():
        print(f"\nclock {device.clock_rate / 1e9:.3f} GHz; two 100 us spins: behind 2 ms of host, plain events "
              f"{plain * 1e6:.0f} us, gpu_time {seconds * 1e6:.0f} us; without the host, gpu_time {fast * 1e6:.0f} us")
    assert plain > 2e-3
    assert 190 * US < seconds < plain / 2
    assert seconds == pytest.approx(fast, rel=0.2, abs=10 * US)


@pytest.mark.gpu
def test_gpu_autotune_picks_the_implicit_gemm_for_r50_64_fp16(monkeypatch, capsys):
    """r50-64 float16 (benchmarks/cases.py: N 32, 64 -> 64 channels, 56 x 56, 3 x 3, padding 1): the implicit GEMM
    took 47 us of kernels on the H200 and conv_fwd_direct 529 us, but autotuning chose the direct kernel while it
    timed the host."""
    import cupy
    monkeypatch.setattr(_autotune, "CACHE", {})
    timings = []

    def recorded(device, run):
        result = _autotune.gpu_time(device, run)
        timings.append(result[0])
        return result

    monkeypatch.setattr(_device.CudaDevice, "timed", recorded)
    rng = numpy.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((32, 64, 56, 56)).astype(numpy.float16))
    weight = cupy.asarray((rng.standard_normal((64, 64, 3, 3)) / 24).astype(numpy.float16))
    with settings.autotune(True):
        cupyconv.conv2d(x, weight, padding=1)
    (chosen,) = _autotune.CACHE.values()
    with capsys.disabled():
        print(f"\nr50-64 fp16 forward: GPU times of the candidates {[round(t * 1e6, 1) for t in timings]} us, "
              f"chose {chosen}")
    assert chosen == "implicit_gemm"


# ---------------------------------------------------------------------------------------------------------
# Which candidate is kept (`keep`): the heuristic's pick unless another beats it by more than timing noise


class ScriptedTimer:
    """A device whose `timed` gives each candidate's seconds from a script, in the order timed; `order` notes it."""

    def __init__(self, seconds: dict):
        self.seconds, self.order = seconds, []

    def timed(self, run):
        result = run()
        self.order.append(result)
        return self.seconds[result], result

    def key(self):
        return ("scripted", id(self))


def tuned(seconds: dict, heuristic: str, candidates=None) -> tuple[str, ScriptedTimer]:
    device = ScriptedTimer(seconds)
    with settings.autotune(True):
        result = _autotune.resolve(device, ("case",), "auto", tuple(candidates or seconds), heuristic, lambda a: a)
    assert _autotune.CACHE[("case", device.key())] == result
    assert _autotune.MEASURED[("case", device.key())] == {c: seconds[c] for c in device.order}
    return result, device


@pytest.mark.parametrize("others_us", [(50, 50), (48, 60), (47.6, 1000), (50.1, 49.9)])
def test_a_tie_or_a_near_tie_goes_to_the_heuristic(gpu, others_us):
    """Within TIE_MARGIN (5%) of the heuristic's 50 us, or slower: the heuristic's pick is kept, whichever order
    the candidates come in."""
    seconds = {"im2col_gemm": others_us[0] * US, "direct": others_us[1] * US, "implicit_gemm": 50 * US}
    result, device = tuned(seconds, "implicit_gemm")
    assert result == "implicit_gemm"
    assert device.order[0] == device.order[-1] == "implicit_gemm"   # timed first and last, the others between


@pytest.mark.parametrize("fastest_us, kept", [(47.4, "im2col_gemm"), (10, "im2col_gemm"), (47.6, "implicit_gemm")])
def test_a_candidate_replaces_the_heuristic_only_beyond_the_margin(gpu, fastest_us, kept):
    seconds = {"im2col_gemm": fastest_us * US, "direct": 49 * US, "implicit_gemm": 50 * US}
    assert tuned(seconds, "implicit_gemm")[0] == kept


def test_a_heuristic_pick_outside_the_candidates_prefers_the_first_as_auto_runs_it(gpu):
    """The direct input gradient at stride 2 is not a candidate: 'auto' without autotuning runs the first candidate
    (`chosen`), and autotuning prefers that one on a near-tie."""
    seconds = {"im2col_gemm": 50 * US, "implicit_gemm": 48 * US}
    result, device = tuned(seconds, "direct")
    assert result == "im2col_gemm" and device.order == ["im2col_gemm", "implicit_gemm", "im2col_gemm"]
    with settings.autotune(False):
        assert _autotune.chosen(device, ("case",), "auto", tuple(seconds), "direct") == "im2col_gemm"


def test_the_kept_candidate_is_never_slower_than_the_heuristic(gpu):
    """Over random timings: the kept candidate's time is at most the heuristic's, and it is not the heuristic only
    where it is more than TIE_MARGIN faster."""
    rng = numpy.random.default_rng(0)
    names = ("im2col_gemm", "direct", "implicit_gemm")
    for trial in range(300):
        seconds = dict(zip(names, rng.uniform(40, 60, 3) * US))
        heuristic = names[trial % 3]
        _autotune.CACHE.clear()
        kept = tuned(seconds, heuristic)[0]
        assert seconds[kept] <= seconds[heuristic]
        assert kept == heuristic or seconds[kept] < (1 - _autotune.TIE_MARGIN) * seconds[heuristic]
        assert kept == heuristic or seconds[kept] == min(seconds.values())


def test_the_heuristic_timed_slow_first_is_timed_again_last(gpu):
    """A GPU whose clock still ramps up while the heuristic's pick is timed first: its second timing, after the
    others, is the one that counts, and a candidate that only beat the slow first timing is not kept."""
    times = iter([60 * US, 49 * US, 48 * US])   # implicit_gemm first (slow), im2col_gemm, implicit_gemm again

    class Ramping(ScriptedTimer):
        def timed(self, run):
            result = run()
            self.order.append(result)
            return next(times), result

    device = Ramping({})
    with settings.autotune(True):
        kept = _autotune.resolve(device, ("case",), "auto", ("im2col_gemm", "implicit_gemm"), "implicit_gemm",
                                 lambda a: a)
    assert kept == "implicit_gemm" and device.order == ["implicit_gemm", "im2col_gemm", "implicit_gemm"]
    assert _autotune.MEASURED[("case", device.key())] == {"implicit_gemm": 48 * US, "im2col_gemm": 49 * US}
