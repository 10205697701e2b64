"""CPU kernel emulator: runs raw_kernels/ CUDA C on NumPy buffers, for CI machines without a GPU.

    from emulator import EmulatedDevice          # or: from tests.emulator import EmulatedDevice
    with cupyconv._device.use_device(EmulatedDevice(order="reverse")):
        out = cupyconv.unfold(x, 3, padding=1)   # NumPy x: the GPU path, emulated

    device = CupyHostDevice()                    # CudaDevice itself, with real CuPy arrays over host memory
    with cupyconv._device.use_device(device):
        out = cupyconv.unfold(device.asarray(x), 3)   # CuPy x: CudaDevice's GPU path, kernels emulated

See EmulatedDevice for the options, _asan.py for the AddressSanitizer mode and _profile.py for the memory counters
(EmulatedDevice(counters=True), profile_report).
"""
from ._asan import (asan_environment, asan_preloaded, assert_clean_under_asan, pytest_under_asan, run_under_asan,
                    sanitizer_report)
from ._build import BuildError, cache_root
from ._device import (EmulatedCublas, EmulatedDevice, EmulatorError, KernelArgumentError, KernelFailure,
                      LaunchConfigError, last_block, spread_blocks)
from ._cupy_host import CupyHostDevice
from ._profile import LaunchProfile, SiteCounters, profile_report
from pathlib import Path as _Path

SELFTEST_KERNEL_DIR = _Path(__file__).resolve().parent / "selftest_kernels"

__all__ = ["EmulatedDevice", "CupyHostDevice", "EmulatedCublas", "EmulatorError", "KernelArgumentError",
           "KernelFailure", "LaunchConfigError",
           "BuildError", "cache_root", "asan_environment", "asan_preloaded", "assert_clean_under_asan",
           "pytest_under_asan", "run_under_asan", "sanitizer_report", "SELFTEST_KERNEL_DIR", "last_block",
           "spread_blocks", "LaunchProfile", "SiteCounters", "profile_report"]
