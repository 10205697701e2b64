"""The strided input gradient on the channels-last kernel (cupyconv/ops/implicit_gemm.py `grad_input_phases`,
`_grad_input_phased`): at stride s > 1, one stride-1 conv_fwd_igemm per phase of the input pixels, each phase's
taps a sub-kernel, phases without taps zero-filled.

The phase arithmetic is checked against a brute-force list of every (input row, grad_output row, tap) triple of
the strided window; the kernels on the emulator against the CPU path in float64 (outputs poisoned: the emulator's
`empty` fills NaN, so a pixel no phase writes fails), and conv_transpose2d through the public API.  Reads and
writes out of bounds: tests/test_tensor_core_sweep.py's ASan run holds 7 specs on the phases (strides (2, 3),
(3, 1), (3, 2), every dtype, layouts and groups).
"""
import itertools
import math

import numpy
import pytest

import cupyconv
from cupyconv import _kernels
from cupyconv._spec import ConvSpec, transposed_spec
from cupyconv.ops import implicit_gemm as igemm
import bug_classes
from bug_classes import Recorder
from reference import ConvCase
from test_igemm_kernels import DTYPES, as64, assert_close, layouts, run  # the tensor-core tests' helpers

C = ConvCase


# ---------------------------------------------------------------------------------------------------------
# The phase arithmetic, one axis


def window_triples(kernel, stride, dilation, pad, size, out_size):
    """Every (input row y, grad_output row o, tap i) with o * stride - pad + i * dilation = y, both in range."""
    return {(o * stride - pad + i * dilation, o, i) for o in range(out_size) for i in range(kernel)
            if 0 <= o * stride - pad + i * dilation < size}


def phase_triples(phase, kernel, stride, out_size):
    """The same triples as the phase's stride-1 convolution reads them: output q (input row first + stride * q),
    its flipped tap j' (original tap taps[m - 1 - j']) at grad_output row q - low + j' * dilation, in range."""
    m, (low, high) = len(phase.taps), phase.padding
    assert out_size + low + high - phase.dilation * (m - 1) == phase.rows   # the stride-1 output size
    return {(phase.first + stride * q, q - low + j * phase.dilation, phase.taps[m - 1 - j])
            for q in range(phase.rows) for j in range(m) if 0 <= q - low + j * phase.dilation < out_size}


@pytest.mark.parametrize("kernel, stride, dilation", [(k, s, d) for k in (1, 2, 3, 4, 5) for s in (1, 2, 3)
                                                      for d in (1, 2, 3)])
def test_phases_are_the_strided_window(kernel, stride, dilation):
    """Per axis, over paddings 0..4 and sizes: the phases' stride-1 windows read exactly the strided window's
    triples (none lost, none extra), each input row is in exactly one phase, and a phase without taps has rows
    that no triple reaches."""
    for pad, size in itertools.product(range(5), range(1, 12)):
        extent = dilation * (kernel - 1) + 1
        out_size = (size + 2 * pad - extent) // stride + 1
        if out_size < 1:
            continue
        phases = igemm.axis_phases(kernel, stride, dilation, pad, size, out_size)
        rows = sorted(phase.first + stride * q for phase in phases for q in range(phase.rows))
        assert rows == list(range(size))
        got = set().union(*(phase_triples(p, kernel, stride, out_size) for p in phases if p.taps))
        assert got == window_triples(kernel, stride, dilation, pad, size, out_size), (pad, size)


def test_stride_1_phase_is_the_transposed_spec():
    spec = ConvSpec.for_conv("t", numpy.empty((2, 16, 9, 8)), numpy.empty((24, 8, 3, 2)), None, stride=1,
                             padding=((0, 2), (3, 0)), dilation=(2, 3), groups=2)
    (phase,) = igemm.grad_input_phases(spec)
    assert igemm.phase_spec(spec, phase) == transposed_spec(spec)


# ---------------------------------------------------------------------------------------------------------
# The kernels on the emulator

CASES = [
    # k 3 s 2, ResNet's downsampling: 4 phases of 2 x 2, 2 x 1, 1 x 2, 1 x 1 taps; odd sizes
    C("ph_k3s2", (2, 16, 9, 7), (24, 16, 3, 3), stride=2, padding=1),
    # k 4 s 2 (conv_transpose2d's upsampling): 2 x 2 taps per phase; asymmetric padding
    C("ph_k4s2_asym", (1, 16, 8, 9), (16, 16, 4, 4), stride=2, padding=((1, 2), (0, 1))),
    # k 2 s 2 and k 1 s 3 per axis: phases without taps (rows 1, 2 of every 3) zero-filled
    C("ph_k1x2_s3x2_empty", (1, 16, 7, 8), (32, 16, 1, 2), stride=(3, 2)),
    # k 5 s 3, dilation 2: phases of 2 and 1 taps at dilation 2; groups 2 with 16 channels each
    C("ph_k5s3_dil2_groups", (1, 32, 13, 11), (32, 16, 5, 5), stride=3, dilation=2, padding=((3, 1), (0, 2)),
      groups=2),
    # stride (2, 1), dilation 2: every row tap in the even phase, none in the odd one; width at stride 1
    C("ph_s2x1_dil2", (2, 24, 9, 9), (16, 24, 3, 5), stride=(2, 1), dilation=2, padding=((2, 1), (3, 2))),
    # 80 input channels: two column tiles of a phase's GEMM; 40 output channels per group
    C("ph_two_column_tiles", (1, 80, 6, 7), (40, 80, 2, 3), stride=2, padding=((0, 1), (1, 0))),
    # stride (2, 1), 16 columns: each phase's rows are contiguous runs of whole 16-byte vectors in grad_input (first
    # pixel, row step and plane multiples of 8): the epilogue's vector stores, at a plane stride not its own
    C("ph_vector_rows", (1, 16, 6, 16), (16, 16, 3, 3), stride=(2, 1), padding=1),
    # stride (2, 1), 4 columns: aligned rows, but 8 halves of a vector would straddle two rows (scalar stores)
    C("ph_narrow_rows", (1, 16, 4, 4), (16, 16, 3, 3), stride=(2, 1), padding=1),
    # stride 2, phases 8 columns wide: phase (0, 0) starts aligned, but its columns are 2 apart: scalar stores
    C("ph_wide_s2", (1, 16, 4, 16), (16, 16, 2, 2), stride=2),
    # one input row at stride 3: the row phases 1 and 2 have no rows at all (not launched, nothing to fill)
    C("ph_one_row", (2, 16, 1, 5), (16, 16, 1, 3), stride=(3, 2), padding=((0, 0), (1, 1))),
    # One launch for all phases (`one_launch`): strides 2 and 3 (height and width differ), 2 x 2 taps per phase,
    # asymmetric padding, groups 2
    C("ph1_k4x6_s2x3_groups", (2, 32, 7, 8), (32, 16, 4, 6), stride=(2, 3), padding=((2, 1), (1, 3)), groups=2),
    # stride 3 at dilation 3: one phase of 3 with taps per axis, the other phases' blocks write their zeros
    C("ph1_s3_dil3_empty", (1, 16, 8, 7), (16, 16, 2, 3), stride=3, dilation=3, padding=((1, 0), (2, 2))),
    # k 3 s 3 per axis (one tap per phase), 80 input channels: two column tiles; two images
    C("ph1_k3s3_two_column_tiles", (2, 80, 7, 5), (16, 80, 3, 3), stride=3, padding=1),
]


def nonempty_phases(spec):
    return [p for p in igemm.grad_input_phases(spec) if all(a.taps for a in p)]


def spec_of(case, x, weight):
    return ConvSpec.for_conv("t", x, weight, None, **case.kwargs)


def recording_array_work(device):
    """Lists every `copyto` of device as (destination, 'copy' or 'fill') and every `add` as (destination, 'add')."""
    work = []
    device.copyto = lambda dst, src: (work.append((dst, "copy" if hasattr(src, "shape") else "fill")),
                                      Recorder.copyto(device, dst, src))
    device.add = lambda dst, src: (work.append((dst, "add")), Recorder.add(device, dst, src))
    return work


def array_work_into(work, out):
    """(shape, kind) of the recorded array work whose destination is (part of) out (e.g. the weight's
    arrangement, into arrays of its own, is not)."""
    return [(dst.shape, kind) for dst, kind in work if numpy.shares_memory(dst, out)]


def one_launch(spec):
    """Whether the phases run as one conv_fwd_igemm_phases launch (32-bit indices): every phase with taps has the
    same taps per axis (the kernel a multiple of stride / gcd(stride, dilation))."""
    return all(k % (s // math.gcd(s, d)) == 0 for k, s, d in zip(spec.kernel_size, spec.stride, spec.dilation))


def empty_phase_shapes(spec):
    """The (n, C, rows, columns) of the phases without taps that have pixels: the fills the phases need."""
    return [(spec.n, spec.in_channels, phase[0].rows, phase[1].rows) for phase in igemm.grad_input_phases(spec)
            if not all(a.taps for a in phase)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_phases_match_cpu_path(case, dtype):
    """grad_input at stride > 1 with D / G in whole 16-byte vectors: one conv_fwd_igemm_phases for all the phases
    where each axis's phases take the same taps (`one_launch`), else one conv_fwd_igemm per phase with taps; one
    channels_last_copies (grad_output and the arranged weight), never the gather; equal to the CPU path.  The
    phases' epilogues write grad_input (poisoned: the emulator's `empty` fills NaN) in place: no array-library copy
    of a phase; one fill per phase without taps where launched apart (none in one launch: those blocks write their
    zeros), and every element written."""
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(11), DTYPES[dtype])
    device = Recorder("reverse" if "empty" in case.name else "forward")
    work = recording_array_work(device)
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    spec = spec_of(case, x, weight)
    phases = nonempty_phases(spec)
    assert len(phases) < len(igemm.grad_input_phases(spec)) or "empty" not in case.name
    assert device.count("conv_fwd_igemm_phases") == (1 if one_launch(spec) else 0), device.launches
    assert device.count("conv_fwd_igemm") == (0 if one_launch(spec) else len(phases)), device.launches
    assert device.count("conv_bwd_input_tc") == 0, device.launches
    assert device.copies() == ["channels_last_copies"], device.launches
    recorded = [(dst.shape, kind) for dst, kind in work]
    fills = [] if one_launch(spec) else [(shape, "fill") for shape in empty_phase_shapes(spec)]
    assert array_work_into(work, got) == fills, recorded
    assert numpy.isfinite(numpy.asarray(got, numpy.float64)).all(), "a poisoned grad_input element was not written"
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert got.shape == x.shape and got.dtype == x.dtype
    assert_close(got, want, dtype, case.name)


def test_patch_conv2d_input_gradient_runs_the_phases():
    """patch_conv2d's backward hands (B, N, C, H, W) grad_input to the same phases (its images flattened)."""
    rng = numpy.random.default_rng(16)
    x = rng.standard_normal((2, 3, 16, 7, 6)).astype(numpy.float16)
    weight = (rng.standard_normal((16, 16, 3, 3)) / 8).astype(numpy.float16)
    grad_output = rng.standard_normal((2, 3, 16, 4, 3)).astype(numpy.float16)
    device = Recorder()
    got = run(device, cupyconv.patch_conv2d_backward, grad_output, x, weight, stride=2, padding=1,
              algorithm="implicit_gemm", needs=("input",))[0]
    assert device.count("conv_fwd_igemm") == 4 and device.count("conv_bwd_input_tc") == 0, device.launches
    flat = [numpy.asarray(a, numpy.float64).reshape(-1, *a.shape[-3:]) for a in (grad_output, x)]
    want = cupyconv.conv2d_backward(flat[0], flat[1], numpy.asarray(weight, numpy.float64), stride=2, padding=1,
                                    needs=("input",))[0]
    assert got.shape == x.shape
    assert_close(got.reshape(want.shape), want, "float16")


@pytest.mark.parametrize("case, launches", [
    # k 3 s 2: a launch per phase, each splitting K, its finish pass after it
    (C("ph_split", (1, 16, 6, 6), (128, 16, 3, 3), stride=2, padding=1), 4),
    # k 4 s 2: all phases in one launch, its split sums (in grad_input's layout) finished by one pass
    (C("ph1_split", (1, 16, 6, 6), (64, 16, 4, 4), stride=2, padding=1), 1),
    # one launch at dilation 2: the odd row phases have no tap, their splits' sums are zeros, still finished
    (C("ph1_split_empty", (1, 16, 6, 7), (64, 16, 3, 4), stride=2, dilation=2, padding=2), 1),
], ids=str)
def test_split_k_in_the_phases(monkeypatch, case, launches):
    """Few pixels per phase, K of 1 to 9 taps x 64 or 128 channels: K split, same sums."""
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", 2)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(12), numpy.float16)
    device = Recorder()
    work = recording_array_work(device)
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    names = [name.split("<")[0] for name in device.launches if not name.startswith("channels_last_cop")]
    kernel = "conv_fwd_igemm_phases" if launches == 1 else "conv_fwd_igemm"
    assert names == [kernel, "conv_bwd_weight_igemm_finish"] * launches, device.launches
    # the finish passes write the phases' pixels of grad_input (poisoned) in place
    assert array_work_into(work, got) == [], [(dst.shape, kind) for dst, kind in work]
    assert numpy.isfinite(numpy.asarray(got, numpy.float64)).all()
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, "float16", case.name)


@pytest.mark.parametrize("layout", ["channels_last", "strided", "negative", "batch_strided"])
def test_one_launch_in_every_layout_of_grad_output(layout):
    """The phases in one launch read grad_output's one channels-last copy (a channels-last grad_output in place,
    no copy of it) whatever its layout: equal to the CPU path, every poisoned element of grad_input written."""
    case = C("ph1_layouts", (2, 16, 7, 9), (24, 16, 4, 3), stride=(2, 3), padding=((1, 2), (0, 1)), dilation=(1, 2))
    rng = numpy.random.default_rng(18)
    x, weight, _, grad_output = case.inputs(rng, numpy.float16)
    view = layouts(rng, grad_output)[layout]
    device = Recorder()
    got = run(device, cupyconv.conv2d_backward, view, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    assert one_launch(spec_of(case, x, weight)) and device.count("conv_fwd_igemm_phases") == 1, device.launches
    # (a channels-last grad_output read in place: the weight copied alone)
    assert device.copies() == ["channels_last_copy" if layout == "channels_last" else "channels_last_copies"]
    assert numpy.isfinite(numpy.asarray(got, numpy.float64)).all()
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, "float16", layout)


def test_generic_path_stays_for_partial_vectors():
    """D / G = 12 halves: not whole 16-byte vectors, so the gather conv_bwd_input_tc, at stride 2 as at 1."""
    case = C("ph_generic", (1, 16, 7, 6), (12, 16, 3, 3), stride=2, padding=1)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(13), numpy.float16)
    device = Recorder()
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    assert device.count("conv_bwd_input_tc") == 1 and device.count("conv_fwd_igemm") == 0, device.launches
    assert_close(got, cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0],
                 "float16")


def test_64_bit_index_variant_and_grad_output_past_2_32(monkeypatch):
    """The `long long` instantiations (INT32_MAX -1) for every phase; grad_output a view whose channel stride
    (2^28 + 3 halves, over sparse memory) puts channels 16 to 23 past 2^32 elements: its one channels-last copy
    reads in 64 bits, the phases read the small copy."""
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    rng = numpy.random.default_rng(14)
    n, d, oh, ow, stride = 1, 24, 4, 5, 2**28 + 3
    base = bug_classes.sparse_zeros((d, stride), numpy.float16)
    grad_output = base[:, :n * oh * ow].reshape(d, n, oh, ow).transpose(1, 0, 2, 3)
    grad_output[...] = rng.standard_normal(grad_output.shape)
    x = numpy.zeros((n, 16, 8, 10), numpy.float16)
    weight = (rng.standard_normal((d, 16, 4, 3)) / 4).astype(numpy.float16)
    kwargs = dict(stride=2, padding=((1, 2), (1, 0)))
    device = Recorder()
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **kwargs)[0]
    launched = [name.split(", ")[:2] for name in device.launches if name.startswith("conv_fwd_igemm<")]
    assert launched == [["conv_fwd_igemm<__half", "long long"]] * 4, device.launches
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **kwargs)[0]
    assert_close(got, want, "float16")


def test_one_launch_geometry_past_32_bits_runs_a_launch_per_phase(monkeypatch):
    """conv_fwd_igemm_phases is instantiated for 32-bit indices only: where an index would pass them (INT32_MAX -1),
    a geometry of one launch (kernel 4 at stride 2) runs the `long long` conv_fwd_igemm once per phase instead."""
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = C("ph1_64", (1, 16, 7, 6), (24, 16, 4, 4), stride=2, padding=1)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(19), numpy.float16)
    device = Recorder()
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    launched = [name.split(", ")[:2] for name in device.launches if name.startswith("conv_fwd_igemm")]
    assert launched == [["conv_fwd_igemm<__half", "long long"]] * 4, device.launches
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, "float16")


# ---------------------------------------------------------------------------------------------------------
# conv_transpose2d: its forward is this input gradient


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, stride, padding, output_padding", [
    (4, 2, 1, 0),    # ct2d-k4s2's geometry: 2 x 2 taps per phase
    (2, 2, 0, 0),    # ct2d-k2s2's: one tap per phase
    (3, 2, 1, 1),    # output_padding 1: the last row and column of the output
    (3, (3, 2), (0, 1), (2, 1)),   # stride 3 rows: a phase of 1 tap and output_padding 2
])
def test_conv_transpose2d_runs_the_phases(kernel, stride, padding, output_padding, dtype):
    rng = numpy.random.default_rng(15)
    x = rng.standard_normal((2, 32, 5, 6)).astype(DTYPES[dtype])
    weight = (rng.standard_normal((32, 16, kernel, kernel)) / 8).astype(DTYPES[dtype])
    bias = rng.standard_normal(16).astype(DTYPES[dtype])
    kwargs = dict(stride=stride, padding=padding, output_padding=output_padding)
    device = Recorder()
    got = run(device, cupyconv.conv_transpose2d, x, weight, bias, algorithm="implicit_gemm", **kwargs)
    fast = device.count("conv_fwd_igemm") + device.count("conv_fwd_igemm_phases")
    assert fast >= 1 and device.count("conv_bwd_input_tc") == 0, device.launches
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv_transpose2d(*(torch.from_numpy(a) for a in as64(x, weight, bias)), **kwargs)
    assert got.shape == tuple(want.shape) and got.dtype == x.dtype
    assert_close(got, want.numpy(), dtype, str(kwargs))



def test_phase_placement_arguments_and_vector_stores():
    """A phase's pixels (first + stride * (i, j)) of (H, W) planes as the kernels take them, and where its rows
    are contiguous runs of whole 16-byte vectors (vector stores) or not (scalar stores)."""
    rows = igemm.PhasePlacement((1, 0), (2, 1), (6, 16))
    assert rows.arguments() == dict(out_plane=96, phase_first=16, phase_row_step=32, phase_column_step=1)
    assert rows.vector_store(16, 8) and not rows.vector_store(12, 8)        # a vector would straddle two rows
    assert not igemm.PhasePlacement((0, 0), (2, 2), (4, 16)).vector_store(8, 8)    # columns 2 apart
    assert not igemm.PhasePlacement((0, 1), (2, 1), (4, 17)).vector_store(16, 8)   # first pixel unaligned
    assert igemm.PhasePlacement((0, 0), (3, 1), (5, 20)).vector_store(20, 4)         # floats: 4 a vector
    assert not igemm.PhasePlacement((0, 0), (3, 1), (5, 20)).vector_store(20, 8)     # row step 60 halves


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, weight_shape, kwargs, kernels, fills", [
    # all phases in one launch (ct2d-k4s2's geometry, odd sizes)
    ((2, 32, 5, 7), (32, 16, 4, 4), dict(stride=2, padding=1), ["conv_fwd_igemm_phases"], 0),
    # one launch at stride 3, dilation 3: the phases without taps write the bias alone
    ((1, 16, 3, 4), (16, 16, 2, 3), dict(stride=3, dilation=3, padding=(1, 2), output_padding=(2, 1)),
     ["conv_fwd_igemm_phases"], 0),
    # a launch per phase (k 1 at stride 3 along rows: rows 1 and 2 of every 3 have no tap: 4 phases filled with the
    # bias)
    ((1, 32, 3, 4), (32, 16, 1, 2), dict(stride=(3, 2), output_padding=(2, 0)), ["conv_fwd_igemm"] * 2, 4),
    # stride 1: one conv_fwd_igemm of the transposed window; with groups 2 of 16 channels, the groups kernel
    ((2, 32, 5, 6), (32, 16, 3, 3), dict(padding=1), ["conv_fwd_igemm"], 0),
    ((2, 32, 5, 6), (32, 16, 3, 3), dict(padding=1, groups=2), ["conv_fwd_igemm_groups"], 0),
], ids=["one_launch", "one_launch_empty_phases", "per_phase_empty_phases", "stride_1", "stride_1_groups"])
def test_conv_transpose2d_adds_its_bias_in_the_epilogue(x_shape, weight_shape, kwargs, kernels, fills, dtype):
    """conv_transpose2d's bias goes into the input gradient's kernels (`input_bias`): their epilogue adds it before
    the one rounding, pixels no tap reaches (phases without taps) get the bias alone; no array work adds it after,
    nor fills the output (poisoned: every element written); the convolution's input is a view, not a fill."""
    rng = numpy.random.default_rng(21)
    x = rng.standard_normal(x_shape).astype(DTYPES[dtype])
    weight = (rng.standard_normal(weight_shape) / 8).astype(DTYPES[dtype])
    bias = (rng.standard_normal(weight_shape[1] * kwargs.get("groups", 1)) * 4).astype(DTYPES[dtype])
    device = Recorder("reverse")
    work = recording_array_work(device)
    got = run(device, cupyconv.conv_transpose2d, x, weight, bias, algorithm="implicit_gemm", **kwargs)
    names = [name.split("<")[0] for name in device.launches if not name.startswith("channels_last_cop")]
    assert names == kernels, device.launches
    assert [kind for dst, kind in work if numpy.shares_memory(dst, got)] == ["copy"] * fills, work
    assert not any(kind == "fill" for _, kind in work), work
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv_transpose2d(*(torch.from_numpy(a) for a in as64(x, weight, bias)),
                                                **kwargs).numpy()
    assert got.shape == want.shape and got.dtype == x.dtype
    assert numpy.isfinite(numpy.asarray(got, numpy.float64)).all(), "a poisoned element was not written"
    assert_close(got, want, dtype, str(kwargs))


def test_conv_transpose2d_bias_with_split_k(monkeypatch):
    """K split in the one launch: the bias rides in split 0's float sums, the finish pass rounds once; the phases
    without taps (dilation 2) finish to the bias alone."""
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", 2)
    rng = numpy.random.default_rng(22)
    x = rng.standard_normal((1, 64, 3, 4)).astype(numpy.float16)
    weight = (rng.standard_normal((64, 16, 3, 4)) / 8).astype(numpy.float16)
    bias = (rng.standard_normal(16) * 4).astype(numpy.float16)
    kwargs = dict(stride=2, dilation=2, padding=2, output_padding=1)
    device = Recorder("reverse")
    work = recording_array_work(device)
    got = run(device, cupyconv.conv_transpose2d, x, weight, bias, algorithm="implicit_gemm", **kwargs)
    names = [name.split("<")[0] for name in device.launches if not name.startswith("channels_last_cop")]
    assert names == ["conv_fwd_igemm_phases", "conv_bwd_weight_igemm_finish"], device.launches
    assert array_work_into(work, got) == []
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv_transpose2d(*(torch.from_numpy(a) for a in as64(x, weight, bias)),
                                                **kwargs).numpy()
    assert numpy.isfinite(numpy.asarray(got, numpy.float64)).all()
    assert_close(got, want, "float16")


@pytest.mark.parametrize("algorithm", ["implicit_gemm", "im2col_gemm"])
def test_conv_transpose2d_bias_after_kernels_without_it(algorithm):
    """Where the input gradient's kernel takes no bias (conv_bwd_input_tc: D / G of 12 halves, not whole vectors),
    it is added after it, once; the GEMM's col2im (fold_col2im) adds it itself."""
    rng = numpy.random.default_rng(23)
    x = rng.standard_normal((1, 12, 4, 5)).astype(numpy.float16)
    weight = (rng.standard_normal((12, 16, 3, 3)) / 8).astype(numpy.float16)
    bias = (rng.standard_normal(16) * 4).astype(numpy.float16)
    device = Recorder()
    work = recording_array_work(device)
    got = run(device, cupyconv.conv_transpose2d, x, weight, bias, stride=2, padding=1, algorithm=algorithm)
    fused = algorithm == "im2col_gemm"
    assert device.count("conv_bwd_input_tc" if not fused else "fold_col2im") == 1, device.launches
    assert [kind for _, kind in work].count("add") == (0 if fused else 1), work
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv_transpose2d(*(torch.from_numpy(a) for a in as64(x, weight, bias)), stride=2,
                                                padding=1).numpy()
    assert_close(got, want, "float16")
