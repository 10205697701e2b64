"""The emulator's memory counters (EmulatedDevice(counters=True), tests/emulator/include/emu_counters.h) on
access patterns whose costs are documented (tests/emulator/selftest_kernels/counters.cu): global sectors per
warp request, shared-memory wavefronts under the bank rules, requests grouped per warp and per execution.
`test_each_rule_is_needed` rebuilds the counters with one rule broken at a time and sees these checks fail."""
from __future__ import annotations

import itertools
import shutil

import numpy
import pytest

from emulator import SELFTEST_KERNEL_DIR, EmulatedDevice, EmulatorError, profile_report, spread_blocks
from emulator import _build, _device

SOURCE = "counters.cu"
KERNELS = ["copy_strided_float", "shared_float_stride", "shared_vector_stride", "shared_half_column",
           "partial_warp_loop", "predicated_helper"]


def device(**kw) -> EmulatedDevice:
    return EmulatedDevice(kernel_dir=SELFTEST_KERNEL_DIR, instantiations=[(SOURCE, k) for k in KERNELS],
                          counters=True, **kw)


def line_of(marker: str) -> str:
    """"counters.cu:<line>" of the access marked `// @marker`."""
    lines = (SELFTEST_KERNEL_DIR / SOURCE).read_text().splitlines()
    found = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"// @{marker}")]
    assert len(found) == 1, marker
    return f"{SOURCE}:{found[0]}"


def copy_counters(dev, stride, offset=0):
    """The load and store sites of copy_strided_float on 2 blocks of 64 threads (4 warps)."""
    data = numpy.random.default_rng(0).standard_normal(2 * 64 * 2 + 8).astype(numpy.float32)
    source = data[offset:]  # a view `offset` floats into its allocation
    out = dev.empty(128, numpy.float32)
    dev.launch(SOURCE, "copy_strided_float", 2, 64, [source, out, numpy.int32(stride)])
    numpy.testing.assert_array_equal(out, source[::stride][:128] if stride else numpy.full(128, source[0]))
    profile = dev.profile[-1]
    return profile.site(line_of("global_load")), profile.site(line_of("global_store"))


@pytest.mark.parametrize("stride, sectors", [(1, 4), (2, 8), (0, 1)])
def test_global_sectors_per_request(stride, sectors):
    load, store = copy_counters(device(), stride)
    assert (load.kind, load.width, load.requests, load.lane_accesses) == ("global_load", 4, 4, 128)
    assert load.sectors_per_request == sectors and load.moved_bytes == 32 * load.sectors
    assert load.lines_per_request == {1: 1, 2: 2, 0: 1}[stride]
    assert load.useful_bytes == (4 * 128 if stride else 4 * 4)  # a broadcast asks for its 4 bytes once per request
    assert load.sector_efficiency == {1: 1.0, 2: 0.5, 0: 4 / 32}[stride]
    assert (store.kind, store.sectors_per_request, store.sector_efficiency) == ("global_store", 4, 1.0)


def test_sectors_count_from_the_allocation():
    """A view 4 bytes into its array starts 4 bytes past a sector boundary on a GPU: each warp's 128 bytes
    touch 5 sectors and 2 lines, whatever address NumPy gave the array itself."""
    load, _ = copy_counters(device(), 1, offset=1)
    assert (load.sectors_per_request, load.lines_per_request) == (5, 2)


@pytest.mark.parametrize("stride, wavefronts", [(0, 1), (1, 1), (2, 2), (4, 4), (32, 32)])
def test_shared_bank_conflicts(stride, wavefronts):
    """32 banks of 4 bytes: stride 0 is a broadcast, 2, 4 and 32 words apart are 2-, 4- and 32-way conflicts."""
    dev = device()
    out = dev.empty(64, numpy.float32)
    dev.launch(SOURCE, "shared_float_stride", 1, 64, [out, numpy.int32(stride)])
    numpy.testing.assert_array_equal(out, stride * (numpy.arange(64) % 32))
    profile = dev.profile[-1]
    for marker, kind in (("shared_load", "shared_load"), ("shared_store", "shared_store")):
        site = profile.site(line_of(marker))
        assert (site.kind, site.width, site.requests, site.lane_accesses) == (kind, 4, 2, 64)
        assert site.wavefronts_per_request == wavefronts, marker
        assert site.sectors == 0 and site.sector_efficiency is None
    fill = profile.site(line_of("shared_fill"))  # 16 iterations of 2 warps, consecutive words
    assert (fill.requests, fill.wavefronts_per_request) == (32, 1)


@pytest.mark.parametrize("stride, period, w8, w16", [(1, 64, 2, 4), (2, 64, 4, 8), (1, 16, 2, 4), (1, 8, 2, 4)])
def test_vector_shared_accesses_per_half_and_quarter_warp(stride, period, w8, w16):
    """8-byte accesses in half warps, 16-byte ones in quarter warps: 2 and 4 wavefronts for a full warp without
    conflicts, also when the half or quarter warps read the same words (a phase serves its own lanes only), and
    twice that 2 elements apart."""
    dev = device()
    out = dev.empty(32, numpy.float32)
    dev.launch(SOURCE, "shared_vector_stride", 1, 32, [out, numpy.int32(stride), numpy.int32(period)])
    numpy.testing.assert_array_equal(out, 2 * (stride * numpy.arange(32) % period))
    p8, p16 = dev.profile[-1].site(line_of("shared_load8")), dev.profile[-1].site(line_of("shared_load16"))
    assert (p8.width, p8.requests, p16.width, p16.requests) == (8, 1, 16, 1)
    assert (p8.wavefronts, p16.wavefronts) == (w8, w16)


@pytest.mark.parametrize("pitch, wavefronts", [(40, 4), (1, 1)])
def test_half_stores_down_a_padded_column(pitch, wavefronts):
    """The tensor-core stage layout: rows of 40 halves (20 words) put 32 lanes in 8 banks, 4-way; lanes on
    neighbouring halves share words (1 wavefront)."""
    dev = device()
    dev.launch(SOURCE, "shared_half_column", 1, 32, [dev.empty(32, numpy.float32), numpy.int32(pitch)])
    store = dev.profile[-1].site(line_of("shared_store2"))
    assert (store.kind, store.width, store.requests, store.wavefronts) == ("shared_store", 2, 1, wavefronts)


def test_requests_are_per_warp_and_per_execution():
    """20 active lanes of each of 2 warps, 3 iterations: 6 requests of 20 lanes, 80 contiguous bytes each from a
    sector boundary: 3 sectors."""
    dev = device()
    data = numpy.arange(5 * 32, dtype=numpy.float32)
    out = dev.empty(64, numpy.float32)
    dev.launch(SOURCE, "partial_warp_loop", 1, 64, [data, out, numpy.int32(20), numpy.int32(3)])
    lane = numpy.arange(64) % 32
    numpy.testing.assert_array_equal(out, numpy.where(lane < 20, 3 * lane + 96, 0))
    load = dev.profile[-1].site(line_of("loop_load"))
    assert (load.requests, load.lane_accesses, load.sectors, load.useful_bytes) == (6, 120, 18, 6 * 80)


def test_a_predicated_load_in_a_helper_pairs_by_call():
    """Lane 0 skips the first of 4 calls' loads: 4 requests of 4 sectors per warp (the first with 31 lanes), as
    the GPU's predicated instruction; pairing by execution count alone would give 5 + 5 + 5 + 4 sectors."""
    dev = device()
    data = numpy.arange(4 * 64, dtype=numpy.float32)
    out = dev.empty(64, numpy.float32)
    dev.launch(SOURCE, "predicated_helper", 1, 64, [data, out, numpy.int32(4)])
    lane = numpy.arange(64) % 32
    numpy.testing.assert_array_equal(out, 4 * lane + 64 * 6)  # lane 0 skips in[0], which is 0
    load = dev.profile[-1].site(line_of("helper_load"))
    assert (load.requests, load.lane_accesses, load.sectors) == (8, 2 * 127, 8 * 4)


def test_only_the_kernels_accesses_count_and_the_sample_is_reported():
    """Every site is a line of the kernel file (the engine's and the headers' own accesses, and the threads'
    locals, are not counted); blocks= runs a sample, which the profile reports; a launch per record."""
    dev = device(blocks=spread_blocks(3))
    data = numpy.zeros(10 * 64, numpy.float32)
    dev.launch(SOURCE, "copy_strided_float", 10, 64, [data, dev.empty(10 * 64, numpy.float32), numpy.int32(1)])
    dev.launch(SOURCE, "shared_half_column", 1, 32, [dev.empty(32, numpy.float32), numpy.int32(40)])
    assert [p.name for p in dev.profile] == ["copy_strided_float", "shared_half_column"]
    copy, half = dev.profile
    assert (copy.grid, copy.block, copy.blocks_run) == ((10, 1, 1), (64, 1, 1), 3)
    assert copy.site(line_of("global_load")).requests == 3 * 2
    for p in dev.profile:
        assert all(s.site.startswith(f"{SOURCE}:") for s in p.sites), p.sites
    # (float)tile[lane] reads through __half's conversion in the emulator's cuda_fp16.h: the kernel's line
    assert half.site(line_of("shared_store2")).kind == "shared_store"
    assert {s.kind for s in half.sites} == {"shared_store", "shared_load", "global_store"}
    report = profile_report(dev.profile)
    assert line_of("global_load") in report and "shared_half_column" in report
    assert copy.to_dict()["sites"][0]["sectors_per_request"] == 4.0


def test_counters_are_not_the_asan_build():
    with pytest.raises(EmulatorError, match="ASan"):
        EmulatedDevice(asan=True, counters=True)


# ---------------------------------------------------------------------------------------------------------
# Each rule is needed: the counters rebuilt with one rule broken fail the checks above.

MUTATIONS = {
    "bank = word % 16": ("(w & 31) << 58 | (w >> 5)", "(w & 15) << 58 | (w >> 4)"),
    "no broadcast": ("if (j > 0 && scratch[j] == scratch[j - 1]) continue;", ""),
    "whole-warp phases": ("width == 8 ? 16 : width == 16 ? 8 : 32", "32"),
    "64-byte sectors": ("distinct_units(all + i, j - i, width, 5, scratch)", "distinct_units(all + i, j - i, width, 6, scratch)"),
    "useful = lanes x width": ("site.useful_bytes += useful_bytes(all + i, j - i, width, scratch);",
                               "site.useful_bytes += (long long)(j - i) * width;"),
    "one request per warp and site": ("site.next[l]++", "0"),
    "pairing by execution count only": ("event.calls[f - 1] = d >= 0 && d < kShadowDepth ? log.call[d] : 0;",
                                        "event.calls[f - 1] = 0;"),
}
CHECKS = [
    lambda: test_shared_bank_conflicts(1, 1),
    lambda: test_shared_bank_conflicts(0, 1),
    lambda: test_vector_shared_accesses_per_half_and_quarter_warp(1, 16, 2, 4),
    lambda: test_global_sectors_per_request(1, 4),
    lambda: test_global_sectors_per_request(0, 1),
    lambda: test_requests_are_per_warp_and_per_execution(),
    lambda: test_a_predicated_load_in_a_helper_pairs_by_call(),
]


@pytest.mark.slow
def test_each_rule_is_needed(tmp_path, monkeypatch):
    """The checks pass with the real rules; with each mutation one of them, at least, fails."""
    for check in CHECKS:
        check()
    header = (_build.INCLUDE_DIR / "emu_counters.h").read_text()
    monkeypatch.setenv("CUPYCONV_EMULATOR_CACHE", str(tmp_path / "cache"))
    survivors = []
    for i, (name, (old, new)) in enumerate(MUTATIONS.items()):
        assert header.count(old) == 1, name
        include = tmp_path / f"include{i}"
        shutil.copytree(_build.INCLUDE_DIR, include)
        (include / "emu_counters.h").write_text(header.replace(old, new))
        monkeypatch.setattr(_build, "INCLUDE_DIR", include)
        monkeypatch.setattr(_device, "_LIBRARIES", {})
        failed = False
        for check in CHECKS:
            try:
                check()
            except AssertionError:
                failed = True
        if not failed:
            survivors.append(name)
    assert not survivors, f"mutations no check catches: {survivors}"


# ---------------------------------------------------------------------------------------------------------
# The shipped tensor-core forward (benchmarks/RESULTS.md, "Emulated memory counters")


def test_a_second_library_of_a_kernel_file_keeps_its_own_shared_memory(monkeypatch):
    """The profile library of implicit_gemm.cu loaded after its plain library in one process: its `__shared__` arrays (template
    statics, which g++ would make STB_GNU_UNIQUE and glibc would bind to the first library's storage) are its own,
    so its shared stores are counted (found by the CI order: without -fno-gnu-unique they vanished).  On conv_fwd_tc,
    whose stages are such statics (the channels-last kernel, refused here, stages in dynamic shared memory)."""
    import cupyconv
    from cupyconv import _device as cupyconv_device
    from cupyconv.ops import implicit_gemm

    monkeypatch.setattr(implicit_gemm, "igemm_refusal", lambda *args: "the generic kernel under test")

    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((1, 16, 8, 8)).astype(numpy.float16)
    w = rng.standard_normal((8, 16, 3, 3)).astype(numpy.float16)
    with cupyconv_device.use_device(EmulatedDevice()):   # the plain library first
        cupyconv.conv2d(x, w, None, padding=1, algorithm="implicit_gemm")
    dev = EmulatedDevice(counters=True)
    with cupyconv_device.use_device(dev):
        cupyconv.conv2d(x, w, None, padding=1, algorithm="implicit_gemm")
    (profile,) = dev.profile
    assert profile.total("shared_store").requests > 0 and profile.total("shared_load").requests > 0


def test_tensor_core_forward_at_the_r50_64_shape(monkeypatch):
    """conv_fwd_tc on 3x3 64 -> 64 56x56 float16 (N = 1: the 64 x 64 tile), two interior blocks: the A operand's
    2-byte stores into its stage are 4-way conflicted (rows 20 words apart), the B stores and the fragment loads
    conflict-free, the activation gather about 2/3 sector-efficient, the weight loads fully.  (The generic kernel:
    the channels-last one, which takes this shape otherwise, is refused here; its own test follows.)"""
    import cupyconv
    from cupyconv import _device as cupyconv_device
    from cupyconv.ops import implicit_gemm

    monkeypatch.setattr(implicit_gemm, "igemm_refusal", lambda *args: "the generic kernel under test")

    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((1, 64, 56, 56)).astype(numpy.float16)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(numpy.float16)
    dev = EmulatedDevice(counters=True, blocks=lambda grid: [(20, 0, 0), (21, 0, 0)])
    with cupyconv_device.use_device(dev):
        cupyconv.conv2d(x, w, None, padding=1, algorithm="implicit_gemm")
    (profile,) = dev.profile
    assert profile.name == "conv_fwd_tc<__half, int, 64, 64>" and profile.blocks_run == 2
    mma = 2 * 4 * 18 * 16  # blocks x warps x chunks of 32 k x mma.sync per chunk
    shared_stores = sorted((s for s in profile.sites if s.kind == "shared_store"), key=lambda s: -s.wavefronts)
    assert [(s.width, s.wavefronts_per_request) for s in shared_stores] == [(2, 4.0), (2, 1.0)]
    assert all(s.wavefronts_per_request == 1.0 for s in profile.sites if s.kind == "shared_load")
    assert profile.total("shared_load").requests == 2 * mma  # 8 A and 8 B fragment loads per 8 mma.sync
    waves = profile.total("shared_load").wavefronts + profile.total("shared_store").wavefronts
    assert waves / mma == 7.0
    loads = sorted((s for s in profile.sites if s.kind == "global_load"), key=lambda s: s.sector_efficiency)
    activation, weight = loads[0], loads[-1]
    assert 0.6 <= activation.sector_efficiency <= 0.75 and activation.width == 2
    assert weight.sector_efficiency == 1.0 and weight.sectors_per_request == 2.0


def assert_lean_transpose(profile, load_width=2):
    """A channels_last_copy profile: its loads (load_width bytes a lane, along pixels) and 16-byte stores (along
    channels) use every sector they move; its shared-memory vectors, 16 bytes a lane, take 4 wavefronts a warp
    request, the minimum (no bank conflict)."""
    kinds = sorted((s.kind, s.width) for s in profile.sites)
    assert kinds == [("global_load", load_width), ("global_store", 16), ("shared_load", 16), ("shared_store", 16)], kinds
    for site in profile.sites:
        assert site.sector_efficiency in (None, 1.0) and site.wavefronts_per_request in (0.0, 4.0), site


@pytest.mark.parametrize("dtype, shape", [("float16", (80, 64, 4, 4)), ("float16", (3, 96, 8, 8)),
                                          ("float32", (40, 16, 4, 4))], ids=["patch-4x4", "8x8-96ch", "tf32-4x4"])
def test_channels_last_copy_of_small_planes(dtype, shape):
    """channels_last_copy on planes of 16 and 64 pixels (the patch seed's 4 x 4, 8 x 8): a tile's 32 rows span
    several images, and still every load and store uses all its sectors with no bank conflict (96 channels: a
    second channel tile half full).  float32 is rounded to tf32."""
    from cupyconv import _device as cupyconv_device
    from cupyconv import settings
    from cupyconv.ops import implicit_gemm

    x = numpy.random.default_rng(1).standard_normal(shape).astype(dtype)
    dev = EmulatedDevice(counters=True)
    with cupyconv_device.use_device(dev), settings.allow_tf32(True):
        out = implicit_gemm.channels_last(dev, x)
    want = numpy.moveaxis(x, 1, -1)
    if dtype == "float32":
        want = ((want.view(numpy.uint32).astype(numpy.uint64) + 0x1000) & 0xFFFFE000).astype(numpy.uint32).view(
            numpy.float32)
    numpy.testing.assert_array_equal(out, want)
    (profile,) = dev.profile
    assert profile.name == f"channels_last_copy<{'__half' if dtype == 'float16' else 'float'}, int, true>"
    assert_lean_transpose(profile, numpy.dtype(dtype).itemsize)


def test_channels_last_forward_at_the_r50_64_shape(monkeypatch):
    """conv_fwd_igemm on the same problem (issue 24's targets): in the main loop every shared-memory access is
    conflict-free -- the cp.async landings (16 bytes a lane: 4 wavefronts a warp, the minimum), the ldmatrix
    reads (one wavefront per 8 x 8 matrix) -- and the cp.async loads of x and the weight use every sector they
    move; the epilogue's 2-byte stores into its transposed tile are conflict-free, its 16-byte stores of out use
    every sector.  The copy of x before it (channels_last_copies, with the weight's; its blocks 20 and 21 are
    x's): both sides 100% of their sectors, no conflicts."""
    import cupyconv
    from cupyconv import _device as cupyconv_device

    from cupyconv.ops import implicit_gemm

    monkeypatch.setattr(implicit_gemm, "IG_SPLIT_CHUNKS", 10**6)   # N = 1 is under a wave: no split-K here
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((1, 64, 56, 56)).astype(numpy.float16)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(numpy.float16)
    dev = EmulatedDevice(counters=True, blocks=lambda grid: [(20, 0, 0), (21, 0, 0)] if grid[0] > 20 else [])
    with cupyconv_device.use_device(dev):
        cupyconv.conv2d(x, w, None, padding=1, algorithm="implicit_gemm")
    transpose, gemm = dev.profile
    assert gemm.name == "conv_fwd_igemm<__half, int, 64, 64, 4>" and gemm.blocks_run == 2
    assert transpose.name == "channels_last_copies<__half, int, false>" and transpose.blocks_run == 2
    assert_lean_transpose(transpose)
    chunks, mma = 18, 2 * 4 * 18 * 16  # chunks of 32 k; blocks x warps x chunks x mma.sync per chunk
    shared = [s for s in gemm.sites if s.kind.startswith("shared")]
    assert all(s.wavefronts_per_request == max(1, s.width // 4) for s in shared), shared  # 16 bytes: 4 (quarters)
    store_lines = {s.site for s in gemm.sites if s.kind == "global_store"}   # the epilogue's 16-byte read + store
    ldmatrix = [s for s in shared if s.kind == "shared_load" and s.site not in store_lines]
    assert all(s.width == 16 for s in ldmatrix), ldmatrix   # a lane's row, read once: 4 wavefronts a warp request
    assert sum(s.requests for s in ldmatrix) == mma // 2   # (2 A + 2 B) ldmatrix.x4 per 8 mma
    landings = [s for s in shared if s.kind == "shared_store" and s.width == 16]
    assert sum(s.requests for s in landings) == 2 * 4 * chunks * 4   # per chunk and lane: 2 A and 2 B vectors
    loads = [s for s in gemm.sites if s.kind == "global_load"]
    assert len(loads) == 2 and all(s.width == 16 and s.sector_efficiency >= 0.95 for s in loads), loads
    # ig_forward's PAIRS (this 64 x 64 tile): a warp request reads 128 bytes of 4 rows, 4 whole lines (8 half
    # ones with a chunk a load): the L1 wavefronts of the global side halve
    assert all(s.lines_per_request <= 4.0 for s in loads), loads
    stores = [s for s in gemm.sites if s.kind == "global_store"]
    assert len(stores) == 1 and stores[0].width == 16 and stores[0].sector_efficiency == 1.0


def test_channels_last_forward_256_rows_in_pairs(monkeypatch):
    """conv_fwd_igemm's 256 x 64 tile (r50-64's, p-seed's) loads two K chunks at once too (ig_forward's PAIRS, with
    the rows' y, x packed in halves: PACKED): every warp request of x and the weight reads 4 whole lines (8 half ones
    a chunk at a time), the cp.async landings and ldmatrix reads are conflict-free, the sums match float64 (the
    last block's rows partly past M, the padding on every side)."""
    import cupyconv
    from cupyconv import _device as cupyconv_device

    from cupyconv.ops import implicit_gemm

    monkeypatch.setattr(implicit_gemm, "IG_WAVE_BLOCKS", 1)        # the largest tile of at most 64 columns
    monkeypatch.setattr(implicit_gemm, "IG_SPLIT_CHUNKS", 10**6)   # no split-K
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((1, 64, 24, 25)).astype(numpy.float16)   # 600 rows: the third block's 88
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(numpy.float16)

    def blocks(grid):   # the GEMM's blocks 1 and 2 (of 3), every block of the copies before it
        if tuple(grid) == (3, 1, 1):
            return [(1, 0, 0), (2, 0, 0)]
        return list(itertools.product(*(range(g) for g in grid)))

    dev = EmulatedDevice(counters=True, blocks=blocks)
    with cupyconv_device.use_device(dev):
        out = cupyconv.conv2d(x, w, None, padding=1, algorithm="implicit_gemm")
    (gemm,) = [p for p in dev.profile if p.name.startswith("conv_fwd_igemm")]
    assert gemm.name == "conv_fwd_igemm<__half, int, 256, 64, 4>" and gemm.blocks_run == 2
    want = cupyconv.conv2d(x.astype(numpy.float64), w.astype(numpy.float64), None, padding=1)
    got = numpy.asarray(out, numpy.float64).transpose(0, 2, 3, 1).reshape(-1, 64)[256:]   # blocks 1 and 2's rows
    numpy.testing.assert_allclose(got, want.transpose(0, 2, 3, 1).reshape(-1, 64)[256:], atol=2e-3 * abs(want).max())
    pairs = 9   # 18 chunks of 32 k
    epilogue = {s.site for s in gemm.sites if s.kind == "global_store"}   # its read of the tile: the last block's
    shared = [s for s in gemm.sites if s.kind.startswith("shared") and s.site not in epilogue]   # lanes part-idle
    assert all(s.wavefronts_per_request == max(1, s.width // 4) for s in shared), shared
    landings = [s for s in shared if s.kind == "shared_store" and s.width == 16]
    assert sum(s.requests for s in landings) == 2 * 4 * pairs * (16 + 4)   # per pair and lane: 16 A, 4 B vectors
    loads = [s for s in gemm.sites if s.kind == "global_load"]
    assert len(loads) == 2 and all(s.width == 16 and s.sector_efficiency >= 0.95 for s in loads), loads
    assert all(s.lines_per_request <= 4.0 for s in loads), loads   # 4.0 where every row is inside
    # x's vectors read: 8 (64 channels) per tap inside the image of each row of M (none past M: `a_yx`'s rows
    # past M below 0 for every tap), the weight's 4 a row and chunk
    taps = [sum(0 <= m // 25 + r - 1 < 24 and 0 <= m % 25 + s - 1 < 25 for r in range(3) for s in range(3))
            for m in range(256, 600)]
    a_load, b_load = sorted(loads, key=lambda s: s.lane_accesses, reverse=True)
    assert (a_load.lane_accesses, b_load.lane_accesses) == (8 * sum(taps), 2 * 64 * 18 * 4), loads


def test_command_line_profiles_a_benchmark_case(tmp_path, capsys, monkeypatch):
    """python -m emulator --case LABEL: the table and the JSON of the case's launches."""
    import json
    from pathlib import Path

    from emulator.__main__ import main

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # benchmarks/, as `python -m` has it
    out = tmp_path / "r50.json"
    assert main(["--case", "r50-64-gpu16", "--batch", "1", "--blocks", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "conv_fwd_igemm<__half, int, 64, 64, 4>" in text and "not GPU measurements" in text
    profiles = json.loads(out.read_text())["profiles"]   # the channels-last copies of x and of the weight first
    assert profiles[0]["name"] == "channels_last_copies<__half, int, false>"
    profile = next(p for p in profiles if p["name"].startswith("conv_fwd_igemm<"))   # (batch 1: K unsplit)
    assert profile["blocks_run"] == 1 and {s["kind"] for s in profile["sites"]} == {
        "global_load", "global_store", "shared_load", "shared_store"}
