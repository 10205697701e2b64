"""A randomized sweep of the three tensor-core passes (raw_kernels/implicit_gemm.cu conv_fwd_tc, conv_bwd_input_tc,
conv_bwd_weight_tc, and conv_fwd_igemm where the channels-last path takes the forward or the input gradient) against the CPU path, on the emulator, as tests/test_conv_kernels.py's case matrix does for
the other algorithms.

`SPECS` is a fixed list of problems drawn from a seeded generator (the same list on every run; `SPECS[i]` is
drawn from seed (SEED, i), so adding specs never changes the earlier ones).  Each runs conv2d (or patch_conv2d
over (B, N, C, H, W) patches) forward and backward with algorithm='implicit_gemm' on fresh random inputs in
float16, bfloat16 or float32 as TF32; outputs start as poison (the emulator's `empty` fills 0xFF: NaN), so an
element no block writes fails the comparison.  The axes no earlier tensor-core test covered (issue 24) are
drawn on purpose, and `test_sweep_covers_the_axes` checks that the list reaches each of them:

- stride and dilation per axis, height differing from width, in every pass (the backward ones included);
- x strided, channels-last, with negative strides or a strided batch, read in place by the forward and the
  weight gradient (the input gradient does not read x; its grad_output is made contiguous);
- more input channels per group than one column tile of the input gradient (its grid has several per group);
- the weight gradient's split-K with several chunks per split and a ragged last split;
- groups, odd sizes, every block tile of TC_TILES, the `long long` instantiations (with negative strides);
- both paths of the forward and the input gradient: the channels-last kernel (conv_fwd_igemm, channels per group
  in whole 16-byte vectors; the input gradient at stride > 1 once per phase, phases without taps zero-filled) and
  the generic ones (`SweepSpec.kernels`);
- small groups several a block (conv_fwd_igemm_groups: 16-bit, groups of 16 or 32 channels in and out, the
  forward and the stride-1 input gradient; conv_bwd_weight_igemm_groups: their weight gradient at any stride): the
  specs from GROUPS_FROM on, 2 to 6 groups (blocks of 64 channels filled or not);
- 64-bit offsets past 2^32 (not only 2^31: an unsigned 32-bit offset wraps silently there, which UBSan cannot
  see), on the sparse-memory device: `test_x_offsets_past_2_32` and `test_plane_offsets_past_2_32`.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy
import pytest

import cupyconv
from cupyconv import _device, _kernels, settings
from cupyconv.ops import conv as conv_op
from cupyconv.ops import implicit_gemm as igemm
import bug_classes
from bug_classes import Recorder
from emulator import assert_clean_under_asan, pytest_under_asan
from optional_deps import BFLOAT16, Dtypes
from reference import ConvCase

SEED = 24
SPEC_COUNT = 99
#: Specs from this index on are drawn by `draw_groups`: conv_fwd_igemm_groups's problems.
GROUPS_FROM = 84
#: Specs from this index on have channel counts per group that are multiples of 8 (4 for float32): the
#: channels-last weight gradient (conv_bwd_weight_igemm) runs them; the earlier ones run conv_bwd_weight_tc.
VECTORISED_FROM = 60
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32})
#: As tests/test_tensor_core_kernels.py: |tensor cores - CPU path| relative to the largest |CPU path| value.
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-3}
#: How x lies in memory (`x_in_layout`); grad_output follows the same layout (the backward copies it).
LAYOUTS = ("contiguous", "channels_last", "strided", "negative", "batch_strided")
PASSES = ("forward", "input", "weight")


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    index: int
    dtype: str
    case: ConvCase        # x is (n, C, H, W) for conv2d, (B, N, C, H, W) for patch_conv2d
    layout: str
    patch: bool
    split_chunks: int     # > 0: the weight gradient splits in chunks of this many TC_CHUNK pixels; 0: the planner
    wide_rows: bool       # the 128-row tile for 16-bit passes with over 32 columns (TC_WIDE_ROWS = 1)
    long_index: bool      # the `long long` instantiations (INT32_MAX = -1)
    order: str

    def __str__(self):
        return self.case.name

    @property
    def spec(self) -> conv_op.ConvSpec:
        x = numpy.empty(self.case.x, numpy.float16)
        return conv_op.ConvSpec.for_conv("sweep", x.reshape(-1, *x.shape[-3:]), numpy.empty(self.case.weight),
                                         None, **self.case.kwargs)

    def fast(self, pass_: str) -> bool:
        """Whether pass_ ('forward' or 'input') runs on the channels-last kernel, conv_fwd_igemm."""
        return igemm.igemm_refusal(self.spec, DTYPES[self.dtype], pass_) is None

    def kernels(self) -> list[str]:
        """The tensor-core kernels of the forward, input gradient and weight gradient, in launch order."""
        weight = (["conv_bwd_weight_igemm_groups" if self.several_groups_a_block("weight") else "conv_bwd_weight_igemm",
                   *([] if igemm.weight_igemm_plan(self.spec, DTYPES[self.dtype])[2] else
                     ["conv_bwd_weight_igemm_finish"])] if self.vectorised else ["conv_bwd_weight_tc"])
        return [*(self.igemm_kernels("forward") if self.fast("forward") else ["conv_fwd_tc"]),
                *(self.igemm_kernels("input") if self.fast("input") else ["conv_bwd_input_tc"]), *weight]

    def igemm_kernels(self, pass_: str) -> list[str]:
        """conv_fwd_igemm_groups where several groups share a block; else conv_fwd_igemm, and its final pass where
        a small grid splits K: the forward's, or the input gradient's: at stride > 1 one conv_fwd_igemm_phases for all
        the phases where `plan_phases` takes them, else one per phase with taps (`grad_input_phases`; stride 1: one,
        the transposed problem's plan)."""
        if self.several_groups_a_block(pass_):
            return ["conv_fwd_igemm_groups"]
        dtype = DTYPES[self.dtype]
        with self.planner():
            # (on the spec the drivers run: `ConvSpec.clamped`, e.g. the dilation of a 1-tap axis 1)
            one_launch = igemm.plan_phases(self.spec.clamped(), dtype) if self.spec.stride != (1, 1) else None
            if pass_ == "forward":
                splits = [igemm.plan_igemm(self.spec, dtype).splits]
            elif pass_ == "input" and one_launch is not None:
                return ["conv_fwd_igemm_phases", *(["conv_bwd_weight_igemm_finish"] * (one_launch.igemm.splits > 1))]
            else:
                splits = [igemm.plan_igemm(igemm.phase_spec(self.spec, p), dtype).splits
                          for p in igemm.grad_input_phases(self.spec) if self.has_taps(p)]
        return [kernel for n in splits for kernel in ["conv_fwd_igemm", *(["conv_bwd_weight_igemm_finish"] * (n > 1))]]

    def several_groups_a_block(self, pass_: str) -> bool:
        """Whether pass_ ('forward' or 'input') runs conv_fwd_igemm_groups (the input gradient: at stride 1 only), or
        ('weight') conv_bwd_weight_igemm_groups."""
        if pass_ == "weight":
            return self.vectorised and igemm.groups_igemm_refusal(self.spec, DTYPES[self.dtype],
                                                                  igemm.IGG_GROUP_CHANNELS) is None
        return (self.fast(pass_) and (pass_ == "forward" or self.case.stride == (1, 1))
                and igemm.groups_igemm_refusal(self.spec, DTYPES[self.dtype]) is None)

    @staticmethod
    def has_taps(phase) -> bool:
        return all(axis.taps for axis in phase)

    def plan(self, pass_: str) -> igemm.TensorCorePlan:
        with self.planner():
            if pass_ == "weight" and self.several_groups_a_block("weight"):
                return igemm.plan_weight_igemm_groups(self.spec, DTYPES[self.dtype])
            if pass_ == "weight" and self.vectorised:
                return igemm.plan_weight_igemm(self.spec, DTYPES[self.dtype])
            return igemm.plan_tensor_cores(self.spec, DTYPES[self.dtype], pass_)

    @property
    def vectorised(self) -> bool:
        """The weight gradient runs conv_bwd_weight_igemm (channels-last, 16-byte copies)."""
        return igemm.weight_igemm_refusal(self.spec, DTYPES[self.dtype]) is None

    @property
    def weight_chunk(self) -> int:
        return igemm.WG_CHUNK[self.dtype] if self.vectorised else igemm.TC_CHUNK

    @contextlib.contextmanager
    def planner(self):
        """The planner and index settings of this spec, patched for the duration."""
        with pytest.MonkeyPatch.context() as mp:
            if self.split_chunks:
                mp.setattr(igemm, "TC_SPLIT_BLOCKS", 10**6)
                mp.setattr(igemm, "TC_SPLIT_CHUNKS", self.split_chunks)
            if self.wide_rows:
                mp.setattr(igemm, "TC_WIDE_ROWS", 1)
            if self.long_index:
                mp.setattr(_kernels, "INT32_MAX", -1)
            yield


def _output_size(size, kernel, stride, dilation, pad):
    return (size + sum(pad) - dilation * (kernel - 1) - 1) // stride + 1


def draw(index: int) -> SweepSpec:
    """Spec `index` of the sweep: a problem small enough for seconds on the emulator, with the axes mixed."""
    rng = numpy.random.default_rng([SEED, index])
    dtype = tuple(DTYPES)[index % 3]
    groups = int(rng.choice([1, 1, 2, 3]))
    wide_channels = index % 6 == 1           # more input channels per group than a 64-column tile
    channels = int(rng.integers(65, 73)) if wide_channels else int(rng.integers(16, 41))
    wide_rows = index % 7 == 3               # the 128-row tile (16-bit passes with over 32 columns)
    outputs = int(rng.integers(33, 72)) if index % 5 == 2 or wide_rows else int(rng.integers(1, 33))
    kernel = (1, 2) if wide_channels else tuple(int(k) for k in rng.integers(1, 5, 2))
    if index >= VECTORISED_FROM:  # whole 16-byte copies of channels; from 128 outputs the 128-row tiles
        vector = igemm.vector_elements(DTYPES[dtype])
        if index % 4 == 1 and dtype != "float32":   # 128 x 128 from WG_WIDE_COLUMNS (tap, c) columns, else 128 x 64
            outputs = 128 + 8 * (index % 3)
            kernel, channels = ((4, 4), 16) if index % 8 == 1 else ((1, 2), channels)
        channels, outputs = (-(-count // vector) * vector for count in (channels, outputs))
    stride = tuple(int(s) for s in rng.integers(1, 4, 2))
    dilation = tuple(int(d) for d in rng.integers(1, 4, 2))
    if index % 2 == 0 and stride[0] == stride[1]:  # height and width differ in most specs
        stride = (stride[0], stride[0] % 3 + 1)
    if index % 2 == 1 and dilation[0] == dilation[1]:
        dilation = (dilation[0] % 3 + 1, dilation[0])
    if index % 4 in (1, 2):   # channels in whole 16-byte vectors: the channels-last path (conv_fwd_igemm)
        channels = -(-channels // 8) * 8
    if index % 8 == 5:        # ... and its input gradient too (stride 1, output channels in vectors)
        stride, outputs = (1, 1), -(-outputs // 8) * 8
    padding = tuple(tuple(int(p) for p in rng.integers(0, 3, 2)) for _ in range(2))
    patch = index % 4 == 3
    split = index % 6 == 0                   # enough output pixels for several splits of several chunks
    size = []
    for k, s, d, pad in zip(kernel, stride, dilation, padding):
        extent = d * (k - 1) + 1
        low = max(1, extent - sum(pad))       # at least one output row
        size.append(int(rng.integers(low + 3 * split, low + (6 if wide_channels else 9) + 3 * split)))
    n = int(rng.integers(4, 6)) if split else int(rng.integers(1, 4))
    lead = (int(rng.integers(1, 3)), int(rng.integers(1, 4))) if patch else (n,)
    images = int(numpy.prod(lead))
    out_pixels = images * int(numpy.prod([_output_size(*a) for a in zip(size, kernel, stride, dilation, padding)]))
    layout = LAYOUTS[index % len(LAYOUTS)]
    case = ConvCase(f"s{index:02d}_{dtype}_{'patch' if patch else 'conv'}_{layout}_g{groups}",
                    (*lead, groups * channels, *size), (groups * outputs, channels, *kernel), stride=stride,
                    padding=padding, dilation=dilation, groups=groups, bias=bool(rng.integers(0, 2)))
    chunks = -(-out_pixels // (igemm.WG_CHUNK[dtype] if index >= VECTORISED_FROM else igemm.TC_CHUNK))
    split_chunks = int(rng.integers(2, chunks // 2 + 1)) if chunks >= 5 else 0  # at least 2 splits, of 2+ chunks
    return SweepSpec(index, dtype, case, layout, patch, split_chunks, wide_rows=wide_rows,
                     long_index=index % 8 == 4, order=("forward", "reverse")[index // 3 % 2])


def draw_groups(index: int) -> SweepSpec:
    """Spec `index` (from GROUPS_FROM on): 2 to 6 groups of 16 or 32 channels in and out (float32 as TF32: 16),
    every layout, the stride 1 of the input gradient on conv_fwd_igemm_groups in two of three, stride and dilation
    per axis; the weight gradient split in chunks of 1 or 2 in two of three."""
    rng = numpy.random.default_rng([SEED, index])
    dtype = ("float16", "bfloat16", "float32")[index % 3]
    channels = 16 if dtype == "float32" else (16, 32)[index // 3 % 2]
    groups = int(rng.integers(2, 7))
    kernel = tuple(int(k) for k in rng.integers(1, 4, 2))
    stride = tuple(int(s) for s in rng.integers(1, 3, 2)) if index % 4 == 0 else (1, 1)
    dilation = tuple(int(d) for d in rng.integers(1, 3, 2))
    padding = tuple(tuple(int(p) for p in rng.integers(0, 3, 2)) for _ in range(2))
    patch = index % 5 == 4
    size = []
    for k, d, pad in zip(kernel, dilation, padding):
        low = max(1, d * (k - 1) + 1 - sum(pad))
        size.append(int(rng.integers(low, low + 9)))
    lead = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) if patch else (int(rng.integers(1, 4)),)
    layout = LAYOUTS[index % len(LAYOUTS)]
    case = ConvCase(f"s{index:02d}_{dtype}_{'patch' if patch else 'conv'}_{layout}_g{groups}x{channels}",
                    (*lead, groups * channels, *size), (groups * channels, channels, *kernel), stride=stride,
                    padding=padding, dilation=dilation, groups=groups, bias=bool(rng.integers(0, 2)))
    # the weight gradient (conv_bwd_weight_igemm_groups) in splits of 1 or 2 chunks in two specs of three
    return SweepSpec(index, dtype, case, layout, patch, (0, 2, 1)[index // 2 % 3], wide_rows=False,
                     long_index=index % 6 == 5,
                     order=("forward", "reverse")[index // 3 % 2])


SPECS = [draw(i) if i < GROUPS_FROM else draw_groups(i) for i in range(SPEC_COUNT)]


# ---------------------------------------------------------------------------------------------------------
# Arrays in every layout


def in_layout(rng, values, layout):
    """values (..., C, H, W) as a view of a larger buffer in `layout`, the rest of the buffer random (so that a
    kernel that reads a wrong element reads a wrong value, not a zero)."""
    shape = values.shape
    if layout == "contiguous":
        return values.copy()
    if layout == "channels_last":
        buffer = rng.standard_normal((*shape[:-3], *shape[-2:], shape[-3])).astype(values.dtype)
        view = numpy.moveaxis(buffer, -1, -3)
    elif layout == "strided":   # every other column of a wider buffer, and a stride between channels
        buffer = rng.standard_normal((*shape[:-3], shape[-3] + 1, shape[-2], 2 * shape[-1] + 1)).astype(values.dtype)
        view = buffer[..., 1:, :, 1::2]
    elif layout == "negative":  # channels and columns reversed
        buffer = rng.standard_normal(shape).astype(values.dtype)
        view = buffer[..., ::-1, :, ::-1]
    elif layout == "batch_strided":
        buffer = rng.standard_normal((2 * shape[0] + 1, *shape[1:])).astype(values.dtype)
        view = buffer[1::2]
    else:
        raise AssertionError(layout)
    view[...] = values
    return view


def inputs(s: SweepSpec, seed: int):
    rng = numpy.random.default_rng(seed)
    x, weight, bias, _ = s.case.inputs(rng, DTYPES[s.dtype])
    grad_output = rng.standard_normal(output_shape(s)).astype(x.dtype)
    return in_layout(rng, x, s.layout), weight, bias, in_layout(rng, grad_output, s.layout)


def output_shape(s: SweepSpec):
    lead = s.case.x[:-3]
    size = tuple(_output_size(*a) for a in zip(s.case.x[-2:], s.case.weight[2:], s.case.stride, s.case.dilation,
                                                s.case.padding))
    return (*lead, s.case.weight[0], *size)


# ---------------------------------------------------------------------------------------------------------
# The sweep


def flat(a):
    """(..., C, H, W) as (images, C, H, W) in float64: what the CPU path's conv2d takes."""
    a = numpy.asarray(a, numpy.float64)
    return a.reshape(-1, *a.shape[-3:])


def assert_close(got, want, dtype, what):
    got = numpy.asarray(got, numpy.float64)
    want = numpy.asarray(want, numpy.float64).reshape(got.shape)
    scale = max(float(numpy.abs(want).max(initial=0.0)), 1e-30)
    err = float(numpy.abs(got - want).max(initial=0.0))  # NaN (an element never written) fails too
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


@pytest.mark.parametrize("s", SPECS, ids=str)
def test_tensor_cores_match_cpu_path(s: SweepSpec):
    x, weight, bias, grad_output = inputs(s, seed=1000 + s.index)
    kwargs = s.case.kwargs
    forward, backward = ((cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward) if s.patch else
                         (cupyconv.conv2d, cupyconv.conv2d_backward))
    device = Recorder(s.order)
    with s.planner(), _device.use_device(device), settings.allow_tf32(True):
        out = forward(x, weight, bias, algorithm="implicit_gemm", **kwargs)
        grads = backward(grad_output, x, weight, algorithm="implicit_gemm", **kwargs)
    index = "long long" if s.long_index else "int"
    kernels = [name.split("<")[0] for name in device.launches  # the tensor-core kernels, and the final pass
               if (f", {index}, " in name or name.startswith("conv_bwd_weight_igemm_finish<") and f", {index}>" in name)
               and not name.startswith("channels_last_cop")]
    assert kernels == s.kernels(), device.launches
    assert s.vectorised or s.index < VECTORISED_FROM   # (specs before it may have whole vectors too)
    if s.vectorised:  # the bias gradient came with the weight gradient
        assert not any(name.startswith("conv_bgrad<") for name in device.launches), device.launches

    want_out = cupyconv.conv2d(flat(x), flat(weight), None if bias is None else bias.astype(numpy.float64),
                               **kwargs)
    want = cupyconv.conv2d_backward(flat(grad_output), flat(x), flat(weight), **kwargs)
    assert out.dtype == x.dtype and out.shape == output_shape(s)
    assert_close(out, want_out, s.dtype, "forward")
    for name, got, w in zip(("grad_input", "grad_weight", "grad_bias"), grads, want):
        assert got.dtype == x.dtype and got.size == w.size, name
        assert_close(got, w, s.dtype, name)


def test_clean_under_asan():
    """Reads outside x (a channels-last or negative stride misapplied), the weight or grad_output abort the ASan
    build.  Every fourth spec: between them every layout and every dtype (the whole list is clean too, in a minute)."""
    specs = SPECS[::4]
    assert {s.layout for s in specs} == set(LAYOUTS) and {s.dtype for s in specs} == set(DTYPES)
    assert_clean_under_asan(pytest_under_asan(*(f"{__file__}::test_tensor_cores_match_cpu_path[{s}]" for s in specs)))


def test_sweep_covers_the_axes():
    """The drawn list reaches every axis the sweep is for (so a change to `draw` cannot quietly drop one)."""
    def tiles(s, pass_):
        return s.plan(pass_).tile

    def axes(specs, prefix=""):
        found = {
            "stride h != w": [s for s in specs if s.case.stride[0] != s.case.stride[1]],
            "dilation h != w": [s for s in specs if s.case.dilation[0] != s.case.dilation[1]],
            "stride and dilation h != w at once, kernel > 1 both ways":
                [s for s in specs if s.case.stride[0] != s.case.stride[1]
                 and s.case.dilation[0] != s.case.dilation[1] and min(s.case.weight[2:]) > 1],
            "padding": [s for s in specs if any(map(any, s.case.padding))],
            "weight gradient: several splits of several chunks, the last one short":
                [s for s in specs if s.plan("weight").splits > 1 and s.plan("weight").chunks_per_split > 1
                 and s.plan("weight").splits * s.plan("weight").chunks_per_split * s.weight_chunk
                 > numpy.prod(output_shape(s)[:-3]) * numpy.prod(output_shape(s)[-2:])],
            "weight gradient: several column tiles": [s for s in specs if s.plan("weight").grid[1] > s.case.groups],
            "groups > 1": [s for s in specs if s.case.groups > 1],
            "bias": [s for s in specs if s.case.bias],
            "patch_conv2d": [s for s in specs if s.patch],
            "long long with negative strides": [s for s in specs if s.long_index and s.layout == "negative"],
        }
        for layout in LAYOUTS:
            for dtype in DTYPES:
                found[f"{layout} x in {dtype}"] = [s for s in specs if s.layout == layout and s.dtype == dtype]
        return {prefix + axis: found_specs for axis, found_specs in found.items()}

    vectorised = [s for s in SPECS if s.vectorised]
    reached = {**axes([s for s in SPECS if not s.vectorised]), **axes(vectorised, "conv_bwd_weight_igemm: ")}
    reached["input gradient: several column tiles per group"] = [s for s in SPECS if s.plan("input").grid[1]
                                                                  > s.case.groups and not s.fast("input")]
    reached["forward on the channels-last path, conv2d and patch_conv2d"] = (
        [s for s in SPECS if s.fast("forward") and s.patch] and [s for s in SPECS if s.fast("forward") and not s.patch])
    reached["forward on the generic path"] = [s for s in SPECS if not s.fast("forward")]
    reached["input gradient on the channels-last path"] = [s for s in SPECS if s.fast("input")]
    reached["input gradient on the generic path"] = [s for s in SPECS if not s.fast("input")]
    several = [s for s in SPECS if s.several_groups_a_block("forward")]
    for dtype, dtype_channels in igemm.IGG_GROUP_CHANNELS.items():
        block = igemm.igemm_groups_channels(DTYPES[dtype])
        for channels in dtype_channels:
            reached[f"conv_fwd_igemm_groups: {channels} channels a group, {dtype}"] = [
                s for s in several if s.spec.channels_per_group == channels and s.dtype == dtype]
            reached[f"conv_fwd_igemm_groups: {channels} channels, {dtype} or its size, groups that do not fill the "
                    f"last block"] = [s for s in several if s.spec.channels_per_group == channels
                                      and DTYPES[s.dtype].itemsize == DTYPES[dtype].itemsize
                                      and s.spec.in_channels % block]
    for layout in LAYOUTS:
        reached[f"conv_fwd_igemm_groups: {layout} x"] = [s for s in several if s.layout == layout]
    reached["conv_fwd_igemm_groups: stride and dilation h != w"] = [
        s for s in several if s.case.stride[0] != s.case.stride[1] and s.case.dilation[0] != s.case.dilation[1]]
    reached["conv_fwd_igemm_groups: the input gradient"] = [s for s in SPECS if s.several_groups_a_block("input")]
    reached["conv_fwd_igemm_groups: patch_conv2d, long long"] = [s for s in several if s.patch] and [
        s for s in several if s.long_index]
    several_weight = [s for s in SPECS if s.several_groups_a_block("weight")]
    for dtype, dtype_channels in igemm.IGG_GROUP_CHANNELS.items():
        for channels in dtype_channels:
            reached[f"conv_bwd_weight_igemm_groups: {channels} channels a group, {dtype}"] = [
                s for s in several_weight if s.spec.channels_per_group == channels and s.dtype == dtype]
    for layout in LAYOUTS:
        reached[f"conv_bwd_weight_igemm_groups: {layout} x"] = [s for s in several_weight if s.layout == layout]
    reached["conv_bwd_weight_igemm_groups: several splits, an odd tap count, stride h != w, bias"] = [
        s for s in several_weight if s.plan("weight").splits > 1] and [
        s for s in several_weight if s.spec.taps % igemm.WGG_TAPS] and [
        s for s in several_weight if s.case.stride[0] != s.case.stride[1]] and [s for s in several_weight if s.case.bias]
    strided_fast = [s for s in SPECS if s.fast("input") and s.case.stride != (1, 1)]
    reached["input gradient on the channels-last path, stride > 1 (phases)"] = strided_fast
    reached["... with a phase that has no taps (zero-filled)"] = [
        s for s in strided_fast if not all(map(s.has_taps, igemm.grad_input_phases(s.spec)))]
    reached["... with a phase of several taps at a dilation"] = [
        s for s in strided_fast if any(s.has_taps(p) and max(p[0].dilation, p[1].dilation) > 1
                                       and len(p[0].taps) * len(p[1].taps) > 1
                                       for p in igemm.grad_input_phases(s.spec))]
    reached["... with split K"] = [s for s in strided_fast
                                   if "conv_bwd_weight_igemm_finish" in s.igemm_kernels("input")]
    reached["... in the ASan run (test_clean_under_asan's every fourth spec)"] = [s for s in strided_fast
                                                                               if s in SPECS[::4]]
    for dtype, dtype_tiles in igemm.TC_TILES.items():
        for tile in dtype_tiles:
            reached[f"{dtype} tile {tile}"] = [s for s in SPECS if s.dtype == dtype and
                                               any(tiles(s, p) == tile for p in PASSES)]
    for dtype, dtype_tiles in igemm.WG_TILES.items():
        for tile in dtype_tiles:
            reached[f"conv_bwd_weight_igemm: {dtype} tile {tile}"] = [s for s in vectorised if s.dtype == dtype
                                                                      and tiles(s, "weight") == tile]
    missing = [axis for axis, specs in reached.items() if not specs]
    assert not missing, missing


# ---------------------------------------------------------------------------------------------------------
# Offsets past 2^32


def on_device(device, fn, *args, **kwargs):
    with _device.use_device(device), settings.allow_tf32(True):
        return fn(*args, **kwargs)


@pytest.mark.parametrize("path", ["generic", "channels_last"])
@pytest.mark.parametrize("reverse", [False, True], ids=["positive", "negative"])
def test_x_offsets_past_2_32(reverse, path, monkeypatch):
    """A small problem whose x is a view with a channel stride of 2^28 + 3 elements over sparse memory: the
    offsets of channels 16 to 23 from x's first element pass 2^32 (with `reverse`, they run below -2^32), so
    the forward's and the weight gradient's gathers need 64-bit offsets all the way; a 32-bit unsigned part
    wraps without any sanitizer noticing, and reads zeros (or far outside) instead of x.  On the channels-last
    path the forward's 64-bit reads are channels_last_copy's (its output, and so conv_fwd_igemm, is small)."""
    if path == "generic":
        monkeypatch.setattr(igemm, "igemm_refusal", lambda *args: "the generic kernels under test")
    rng = numpy.random.default_rng(31)
    n, c, h, w, stride = 2, 24, 5, 7, 2**28 + 3
    base = bug_classes.sparse_zeros((c, stride), numpy.float16)
    x = base[:, :n * h * w].reshape(c, n, h, w).transpose(1, 0, 2, 3)
    if reverse:
        x = x[:, ::-1]
    x[...] = rng.standard_normal(x.shape)
    weight = (rng.standard_normal((20, c, 3, 2)) / 4).astype(numpy.float16)
    bias = rng.standard_normal(20).astype(numpy.float16)
    kwargs = dict(stride=(1, 2), padding=((1, 0), (1, 1)), dilation=(2, 1))
    assert _kernels.index_type(_kernels.extent(x)) == "long long"
    device = Recorder()
    out = on_device(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **kwargs)
    grad_output = rng.standard_normal(out.shape).astype(numpy.float16)
    _, grad_w, _ = on_device(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                             needs="weight", **kwargs)
    forward = [["conv_fwd_tc<__half", "long long"]] if path == "generic" else [
        ["channels_last_copy<__half", "long long"], ["channels_last_copy<__half", "int"], ["conv_fwd_igemm<__half", "int"]]
    assert [name.split(", ")[:2] for name in device.launches] == forward + [["conv_bwd_weight_tc<__half", "long long"]]
    xc = numpy.array(x, numpy.float64)
    assert_close(out, cupyconv.conv2d(xc, flat(weight), bias.astype(numpy.float64), **kwargs), "float16",
                 "forward")
    want = cupyconv.conv2d_backward(flat(grad_output), xc, flat(weight), needs="weight", **kwargs)[1]
    assert_close(grad_w, want, "float16", "grad_weight")


def test_plane_offsets_past_2_32(monkeypatch):
    """32 channels of a 12000 x 12000 plane, contiguous: channel 31 starts 4.46e9 elements in, past 2^32, in x,
    grad_output, out and grad_x.  Only the last block of each launch runs (`SparseDevice`): the last 64 pixels of
    the last row, every channel, which match the CPU path on the 2 x 65 corner that feeds them.  The generic
    kernels: the channels-last path's transpose would run its last block only, leaving the corner unwritten."""
    monkeypatch.setattr(igemm, "igemm_refusal", lambda *args: "the generic kernels under test")
    rng = numpy.random.default_rng(37)
    side, c = 12000, 32
    x = bug_classes.sparse_zeros((1, c, side, side), numpy.float16)
    x[:, :, -2:, -65:] = rng.standard_normal((1, c, 2, 65))
    grad_output = bug_classes.sparse_zeros((1, c, side, side), numpy.float16)
    grad_output[:, :, -2:, -65:] = rng.standard_normal((1, c, 2, 65))
    weight = (rng.standard_normal((c, c, 3, 3)) / 8).astype(numpy.float16)
    corner = [flat(a[:, :, -2:, -65:]) for a in (x, grad_output)]
    device = bug_classes.SparseDevice(tail=64)
    out = on_device(device, cupyconv.conv2d, x, weight, padding=1, algorithm="implicit_gemm")
    want = cupyconv.conv2d(corner[0], flat(weight), padding=1)[0, -1, -1, 1:]
    bug_classes.assert_tail_written(out, want, numpy.float16, 64, "forward")
    (grad_x, _, _) = on_device(device, cupyconv.conv2d_backward, grad_output, x, weight, padding=1,
                               needs="input", algorithm="implicit_gemm")
    want = cupyconv.conv2d_backward(corner[1], corner[0], flat(weight), padding=1)[0][0, -1, -1, 1:]
    bug_classes.assert_tail_written(grad_x, want, numpy.float16, 64, "grad_input")
    assert [name.split(", ")[:2] for name in device.launches] == [
        [f"{kernel}<__half", "long long"] for kernel in ("conv_fwd_tc", "conv_bwd_input_tc")]
