"""conv2d's GPU path (raw_kernels/conv.cu, the unfold kernels and the GEMMs) against the NumPy CPU path.

Every algorithm runs through the CPU kernel emulator (tests/emulator) in both thread orders; the same matrix
runs on CuPy arrays with `pytest -m gpu` on a machine with a GPU.  Problems are data (`CASES`); odd sizes
throughout, so no tile or block size divides them.

The bug classes of issue 12 (each side's padding alone and the last row and column, 16-bit accumulation, loops
over several blocks, 64-bit indices past 2^31) are covered on purpose for every kernel here: the table in
tests/emulator/README.md ("Bug classes the kernel tests cover on purpose") names the test of each.
"""
import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
import reference as ref
from cupyconv import _autotune, _device, _kernels
from cupyconv._spec import ceil_div
from cupyconv.ops import conv as conv_op
import bug_classes
from emulator import EmulatedDevice, assert_clean_under_asan, pytest_under_asan
from emulator._device import EmulatedCublas
from reference import NEEDS, NEEDS_SUBSETS, ConvCase

C = ConvCase
ALGORITHMS = ("im2col_gemm", "direct")
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32,
          "float64": numpy.float64})
#: Largest |GPU path - CPU path| allowed, relative to the largest |CPU path| value of the array.  Both
#: compute in float32 (float64) with different summation orders; the half types differ by a rounding or two.
TOLERANCE = {"float64": 1e-12, "float32": 2e-6, "float16": 4e-3, "bfloat16": 3e-2}

CASES = [
    C("plain", (2, 3, 7, 6), (4, 3, 3, 3), padding=1),
    C("groups2_stride2", (2, 4, 9, 7), (6, 2, 3, 3), stride=2, padding=1, groups=2),
    C("groups3_dilation2_asymmetric", (1, 6, 8, 9), (3, 2, 3, 2), padding=((2, 0), (1, 3)), dilation=2,
      groups=3),
    C("same_stride2_even_kernel", (2, 3, 9, 8), (5, 3, 4, 3), stride=2, padding="same"),
    C("same_stride1_dilated_no_bias", (1, 3, 9, 8), (5, 3, 4, 2), padding="same", dilation=(2, 1), bias=False),
    C("pointwise", (2, 5, 4, 3), (3, 5, 1, 1)),
    C("pointwise_stride2_groups2", (2, 6, 5, 5), (4, 3, 1, 1), stride=2, groups=2),
    C("outputs_per_group_7", (1, 4, 6, 5), (14, 2, 3, 3), padding=1, groups=2),
    C("wide_groups_over_16", (2, 18, 5, 6), (20, 18, 3, 3), padding=((3, 0), (0, 4)), dilation=(1, 2)),
    C("kernel_larger_than_input", (1, 2, 3, 3), (2, 2, 5, 5), padding=1),
    C("everything", (2, 6, 8, 9), (4, 3, 3, 2), stride=(2, 3), padding=((1, 0), (2, 1)), dilation=(1, 2),
      groups=2),
    # stride_h != stride_w on an output wider than one 32-column tile of the direct kernel: tile_x > 0 rows
    C("stride21_two_tiles_x", (1, 2, 7, 35), (3, 2, 3, 3), stride=(2, 1), padding=1),
]
CASE_BY_NAME = {case.name: case for case in CASES}
DTYPE_CASE = C("dtype_groups2", (2, 4, 7, 6), (6, 2, 3, 3), padding=1, groups=2)


def assert_close(got, want, dtype, what=""):
    got, want = numpy.asarray(got, numpy.float64), numpy.asarray(want, numpy.float64)
    assert got.shape == want.shape, what
    scale = max(float(numpy.abs(want).max(initial=0.0)), 1e-30)
    err = float(numpy.abs(got - want).max(initial=0.0))
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


class Recorder(EmulatedDevice):
    """An EmulatedDevice that logs the kernels it launches (name expressions) and its GEMMs (`matmul_strided`
    calls: one per batched product, however many cuBLAS calls it makes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.launches, self.gemms = [], 0

    def launch(self, source, name, grid, block, args, shared_mem=0):
        self.launches.append(name)
        super().launch(source, name, grid, block, args, shared_mem)

    def matmul_strided(self, a, b, out, *, beta=0.0):
        self.gemms += 1
        return super().matmul_strided(a, b, out, beta=beta)

    def count(self, kernel: str) -> int:
        return sum(name.startswith(kernel + "<") for name in self.launches)


def kernel_path(device, fn, *args, **kwargs):
    with _device.use_device(device):
        return fn(*args, **kwargs)


def check_case(device, case, algorithm, dtype="float64", seed=0, needs=NEEDS):
    """Forward and backward on the GPU path (device) against the CPU path on the same inputs."""
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(seed), DTYPES[dtype])
    out = kernel_path(device, cupyconv.conv2d, x, weight, bias, algorithm=algorithm, **case.kwargs)
    assert out.dtype == x.dtype
    assert_close(out, cupyconv.conv2d(x, weight, bias, **case.kwargs), dtype, f"{case.name}: forward")
    grads = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, needs=needs,
                        algorithm=algorithm, **case.kwargs)
    expected = cupyconv.conv2d_backward(grad_output, x, weight, needs=needs, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, expected):
        if want is None:
            assert got is None, name
        else:
            assert got.dtype == x.dtype, name
            assert_close(got, want, dtype, f"{case.name}: grad {name}")
    return out, grads


# ---------------------------------------------------------------------------------------------------------
# Every algorithm, every geometry, both thread orders


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_cpu_path(case, algorithm, order):
    device = Recorder(order)
    check_case(device, case, algorithm)
    assert (device.count("conv_fwd_direct") > 0) == (algorithm == "direct")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_dtypes(dtype, algorithm):
    check_case(EmulatedDevice("reverse"), DTYPE_CASE, algorithm, dtype)


def test_half_accumulates_in_float32():
    """Terms of half an ulp of the running sum vanish if the sum is kept in float16."""
    x = numpy.full((1, 16, 3, 5), 2.0 ** -11, numpy.float16)
    x[:, 0] = 1.0
    weight = numpy.ones((2, 16, 1, 1), numpy.float16)
    for algorithm in ALGORITHMS:
        out = kernel_path(EmulatedDevice(), cupyconv.conv2d, x, weight, algorithm=algorithm)
        numpy.testing.assert_array_equal(out, numpy.float16(1.0 + 15 * 2.0 ** -11), err_msg=algorithm)


def test_non_contiguous_and_negative_strides():
    """x is read in place through its strides (transposed, reversed); the other arrays are copied if needed."""
    case = CASE_BY_NAME["everything"]
    rng = numpy.random.default_rng(2)
    n, c, h, w = case.x
    x = ref.random(rng, (n, c, w, h)).transpose(0, 1, 3, 2)[:, ::-1]
    weight = ref.random(rng, case.weight)[..., ::-1, :]
    bias = ref.random(rng, (2 * case.weight[0],))[::-2]
    grad_output = ref.random(rng, case.output_shape)[:, :, :, ::-1]
    for algorithm in ALGORITHMS:
        out = kernel_path(EmulatedDevice(), cupyconv.conv2d, x, weight, bias, algorithm=algorithm, **case.kwargs)
        assert_close(out, cupyconv.conv2d(x, weight, bias, **case.kwargs), "float64", algorithm)
        grads = kernel_path(EmulatedDevice(), cupyconv.conv2d_backward, grad_output, x, weight,
                            algorithm=algorithm, **case.kwargs)
        for name, got, want in zip(NEEDS, grads, cupyconv.conv2d_backward(grad_output, x, weight, **case.kwargs)):
            assert_close(got, want, "float64", f"{algorithm}: grad {name}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_empty_batch(algorithm):
    x = numpy.empty((0, 4, 6, 5))
    weight = ref.random(numpy.random.default_rng(3), (6, 2, 3, 3))
    device = Recorder()
    out = kernel_path(device, cupyconv.conv2d, x, weight, numpy.ones(6), stride=2, padding=1, groups=2,
                      algorithm=algorithm)
    assert out.shape == (0, 6, 3, 3)
    grad_x, grad_w, grad_b = kernel_path(device, cupyconv.conv2d_backward, numpy.empty((0, 6, 3, 3)), x, weight,
                                         stride=2, padding=1, groups=2, algorithm=algorithm)
    assert grad_x.shape == x.shape
    numpy.testing.assert_array_equal(grad_w, numpy.zeros(weight.shape))
    numpy.testing.assert_array_equal(grad_b, numpy.zeros(6))


# ---------------------------------------------------------------------------------------------------------
# The direct kernel's corners: several input slabs, several items per block, a tile that cannot fit


def test_direct_slabs_and_block_loop(monkeypatch):
    """One input channel per slab (the slab loop's barriers) and 3 blocks walking every item."""
    monkeypatch.setattr(conv_op, "DIRECT_SHARED_TARGET", 1)
    monkeypatch.setattr(_kernels, "GRID_CAP", 3)
    for order in ("forward", "reverse"):
        device = Recorder(order)
        check_case(device, CASE_BY_NAME["groups3_dilation2_asymmetric"], "direct")
        check_case(device, CASE_BY_NAME["outputs_per_group_7"], "direct")


def test_direct_that_cannot_fit_shared_memory():
    case = C("huge_dilation", (1, 1, 205, 410), (1, 1, 3, 3), dilation=(100, 200))
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(4))
    with pytest.raises(ValueError, match="algorithm='direct' cannot stage"):
        kernel_path(EmulatedDevice(), cupyconv.conv2d, x, weight, bias, algorithm="direct", **case.kwargs)
    device = Recorder()
    out = kernel_path(device, cupyconv.conv2d, x, weight, bias, **case.kwargs)  # auto: im2col + GEMM
    assert device.count("unfold_im2col") == 1 and device.count("conv_fwd_direct") == 0
    assert_close(out, cupyconv.conv2d(x, weight, bias, **case.kwargs), "float64")


# ---------------------------------------------------------------------------------------------------------
# Few channels per group (ResNeXt's 4 and 8): the direct kernel's blocks of DPT outputs over one staged tile of the
# group's channels (or, where they do not fit, a slab at a time, staged again for each block of outputs), its rows
# per thread past the last output row and its 32-column tiles past the last column, against float64 loops

#: (groups, input channels per group, output channels per group): DPT 2, 4 and 8 exactly, padded (3, 5, 7) and
#: several blocks of 8 (12, 16, 17)
SMALL_GROUPS = [(3, 2, 2), (2, 3, 5), (4, 4, 4), (2, 5, 12), (2, 8, 8), (1, 16, 16), (2, 7, 17)]
#: (input H x W, kernel, window): stride 1 on tiles down (16 rows with 64 threads) and across (32 columns); a
#: strided, dilated window with each side's padding different and an output under 16 columns; stride 2 across
#: two column tiles, dilation 2 and the bottom's padding; stride 2 and dilation 2 over two column tiles.  The first
#: takes the forward's sliding rows (stride and dilation 1 down, 3 kernel rows), the others its general loop; the
#: first and the last the weight gradient's sliding rows (3 x 3, stride = dilation down, 32 columns), the others
#: its general loop (the third: stride 1, dilation 2 down).
SMALL_GROUP_WINDOWS = [
    ((19, 37), (3, 3), dict(padding=1)),
    ((13, 9), (3, 2), dict(stride=(2, 1), padding=((1, 0), (0, 2)), dilation=(2, 2))),
    ((11, 100), (3, 3), dict(stride=(1, 2), padding=((0, 2), (1, 1)), dilation=2)),
    ((23, 70), (3, 3), dict(stride=2, padding=(2, 1), dilation=2)),
]


def small_group_x(rng, shape, layout):
    """x of shape (N, C, H, W) in a layout the kernel reads through its strides: contiguous, channels-last, or
    every other column of a wider array, rows reversed."""
    if layout == "channels_last":
        n, c, h, w = shape
        return numpy.ascontiguousarray(ref.random(rng, (n, h, w, c))).transpose(0, 3, 1, 2)
    if layout == "strided":
        return ref.random(rng, (*shape[:3], 2 * shape[3]))[:, :, ::-1, ::2]
    return ref.random(rng, shape)


@pytest.mark.parametrize("config", ["whole_group", "one_channel_few_splits"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("groups, cg, dg", SMALL_GROUPS, ids=str)
def test_small_groups_against_float64_loops(groups, cg, dg, order, config, monkeypatch):
    """Forward, weight and bias gradients (one kernel) and, for stride 1, the input gradient (the forward kernel on
    the transposed problem) of every window against tests/reference.py's loops, on outputs poisoned by the emulator
    (NaN until written).  The weight gradient's tiles are 5 rows (several down), and with few splits each walks several
    (image, tile) units."""
    monkeypatch.setattr(conv_op, "DIRECT_THREADS", 64)       # 2 rows of 32 threads: tiles of 16 rows
    monkeypatch.setattr(conv_op, "WGRAD_ROWS", 5)
    if config == "one_channel_few_splits":
        monkeypatch.setattr(conv_op, "DIRECT_SHARED_TARGET", 1)
        monkeypatch.setattr(conv_op, "WGRAD_BLOCKS", 3)
    rng = numpy.random.default_rng(groups * 100 + cg * 10 + dg)
    for k, ((h, w), kernel, window) in enumerate(SMALL_GROUP_WINDOWS):
        x = small_group_x(rng, (2, groups * cg, h, w), ("contiguous", "channels_last", "strided", "contiguous")[k])
        weight, bias = ref.random(rng, (groups * dg, cg, *kernel)), ref.random(rng, (groups * dg,))
        device = Recorder(order)
        out = kernel_path(device, cupyconv.conv2d, x, weight, bias, groups=groups, algorithm="direct", **window)
        assert device.launches == [f"conv_fwd_direct<double, int, {conv_op._direct_outputs(dg)}>"]
        what = f"{groups} groups of {cg} -> {dg}, {window}"
        ref.assert_close(out, ref.conv2d(x, weight, bias, groups=groups, **window), err_msg=what)
        grad_output = ref.random(rng, out.shape)
        stride_1 = window.get("stride", 1) == 1
        needs = ("input", "weight", "bias") if stride_1 else ("weight", "bias")
        grads = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, groups=groups, needs=needs,
                            algorithm="direct", **window)
        assert device.count("conv_bwd_weight_direct") == 1 and device.count("conv_fwd_direct") == 1 + stride_1
        # the bias summed by the weight gradient's kernel, both finished by one conv_bgrad_sum, where its bias sums
        # fit in shared memory beside the tiles (not for 16 channels of double through the dilated windows)
        spec = conv_op.ConvSpec.for_conv("conv2d", x, weight, None, window.get("stride", 1), window["padding"],
                                         window.get("dilation", 1), groups)
        fused = conv_op.plan_weight_direct(spec, x.dtype, bias=True) is not None
        assert fused or cg == 16, what
        assert device.count("conv_bgrad") == 1 - fused and device.count("conv_bgrad_sum") == 2 - fused, device.launches
        want = ref.conv2d_grads(grad_output, x, weight, groups=groups, **window)
        ref.assert_close(grads[1], want[1], err_msg=f"grad_weight: {what}")
        ref.assert_close(grads[2], want[2], err_msg=f"grad_bias: {what}")
        if stride_1:
            ref.assert_close(grads[0], want[0], err_msg=f"grad_input: {what}")


def test_weight_gradient_ragged_last_split(monkeypatch):
    """7 (image, tile) units of one 32-column output row in 3 splits of 3, 3 and 1: the last split stops at its unit
    (no reads past the batch: the ASan run below covers this test too)."""
    monkeypatch.setattr(conv_op, "WGRAD_ROWS", 1)
    monkeypatch.setattr(conv_op, "WGRAD_BLOCKS", 3)
    case = C("ragged", (1, 2, 7, 20), (2, 2, 3, 3), padding=1)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(14))
    spec = conv_op.ConvSpec.for_conv("conv2d", x, weight, None, 1, 1, 1, 1)
    plan = conv_op.plan_weight_direct(spec, x.dtype)
    assert (plan.grid[0], plan.units_per_split) == (3, 3)
    device = Recorder()
    (_, grad_w, _) = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, needs="weight",
                                 algorithm="direct", **case.kwargs)
    assert device.count("conv_bwd_weight_direct") == 1
    ref.assert_close(grad_w, ref.conv2d_grads(grad_output, x, weight, **case.kwargs)[1])


def test_small_groups_16_bit_and_auto():
    """'auto' runs the direct kernel for groups of 4 in float16 (fewer than TC_MIN_CHANNELS for the tensor
    cores), accumulating in float32: the result is the float64 sum rounded once."""
    rng = numpy.random.default_rng(31)
    x = bug_classes.exact_terms(rng, (2, 16, 21, 35), "float16")
    weight = bug_classes.exact_terms(rng, (16, 4, 3, 3), "float16")
    device = Recorder()
    out = kernel_path(device, cupyconv.conv2d, x, weight, padding=1, groups=4)
    assert device.launches == ["conv_fwd_direct<__half, int, 4>"]
    want = ref.conv2d(x, weight, padding=1, groups=4)
    numpy.testing.assert_array_equal(out, want.astype(numpy.float16))


# ---------------------------------------------------------------------------------------------------------
# Algorithm choice, needs, determinism, workspace, index types


@pytest.mark.parametrize("case, expected", [
    (CASE_BY_NAME["plain"], "direct"),                       # 3 in, 4 out per group
    (CASE_BY_NAME["outputs_per_group_7"], "direct"),
    (CASE_BY_NAME["wide_groups_over_16"], "im2col_gemm"),    # 18 in, 20 out
    (C("out_over_16", (1, 4, 5, 5), (17, 4, 3, 3)), "im2col_gemm"),
    (C("resnext_like", (1, 64, 5, 5), (64, 4, 3, 3), groups=16), "direct"),
], ids=str)
def test_auto_heuristic(case, expected):
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(5))
    spec = conv_op.ConvSpec.for_conv("conv2d", x, weight, bias, case.stride, case.padding, case.dilation,
                                     case.groups)
    assert conv_op.choose_algorithm(spec, x.dtype) == expected
    device = Recorder()
    out = kernel_path(device, cupyconv.conv2d, x, weight, bias, **case.kwargs)
    assert (device.count("conv_fwd_direct") == 1) == (expected == "direct")
    assert_close(out, cupyconv.conv2d(x, weight, bias, **case.kwargs), "float64")


def test_invalid_algorithm():
    x, weight, _, grad_output = CASE_BY_NAME["plain"].inputs(numpy.random.default_rng(6))
    for run in (lambda: cupyconv.conv2d(x, weight, algorithm="winograd"),
                lambda: kernel_path(EmulatedDevice(), cupyconv.conv2d, x, weight, algorithm="fft"),
                lambda: cupyconv.conv2d_backward(grad_output[:, :, 1:-1, 1:-1], x, weight, algorithm="gemm")):
        with pytest.raises(ValueError, match="algorithm must be one of"):
            run()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("needs", NEEDS_SUBSETS, ids=repr)
def test_needs_computes_only_what_is_asked(needs, algorithm):
    case = CASE_BY_NAME["groups2_stride2"]  # stride 2: grad_input is GEMM + col2im for both algorithms
    check_case(Recorder(), case, algorithm, needs=needs)
    device = Recorder()  # the backward pass alone: its im2col feeds only the weight gradient
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(0))
    kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, needs=needs, algorithm=algorithm,
                **case.kwargs)
    weight_kernel = "conv_bwd_weight_direct" if algorithm == "direct" else "unfold_im2col"   # im2col + GEMM
    assert (device.count("fold_col2im") > 0) == ("input" in needs)
    assert (device.count(weight_kernel) > 0) == ("weight" in needs)
    fused = algorithm == "direct" and "weight" in needs   # conv_bwd_weight_direct sums the bias too
    assert (device.count("conv_bgrad") > 0) == ("bias" in needs and not fused)
    assert device.count("conv_bgrad_sum") == ("bias" in needs and not fused) + fused
    assert device.gemms == ("input" in needs) + ("weight" in needs and algorithm != "direct")


def test_grad_weight_and_bias_are_bit_deterministic():
    """Same bits from run to run, thread order and block order included (no float atomics)."""
    case = C("determinism", (3, 6, 9, 8), (6, 3, 3, 3), padding=1, groups=2)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(7), numpy.float32)
    runs = []
    for order in ("forward", "reverse", "forward"):
        for limit in (None, 2000):  # one chunk, then three (the chunks are summed in order)
            _, gw, gb = kernel_path(EmulatedDevice(order), cupyconv.conv2d_backward, grad_output, x, weight,
                                    needs=("weight", "bias"), workspace_limit=limit, **case.kwargs)
            runs.append((limit, gw.tobytes(), gb.tobytes()))
    for limit in (None, 2000):
        same = [r[1:] for r in runs if r[0] == limit]
        assert all(r == same[0] for r in same), limit


def test_workspace_budget_chunks_the_batch():
    """A call whose full im2col exceeds the budget runs in chunks of the batch and gives the same result."""
    case = C("chunked", (5, 3, 6, 7), (4, 3, 3, 3), padding=1)
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(8))
    n, c, h, w = case.x
    oh, ow = case.output_shape[2:]
    cols = c * 9 * oh * ow * x.itemsize                     # forward: one sample's im2col
    grad_input = cols + c * h * w * x.itemsize             # its GEMM output + its slice of col2im's output
    grad_weight = cols + case.weight[0] * oh * ow * x.itemsize  # wgrad cols + transposed grad_output
    full = kernel_path(Recorder(), cupyconv.conv2d, x, weight, bias, **case.kwargs)
    full_grads = kernel_path(Recorder(), cupyconv.conv2d_backward, grad_output, x, weight, **case.kwargs)

    device = Recorder()
    assert n * cols > 2 * cols
    out = kernel_path(device, cupyconv.conv2d, x, weight, bias, algorithm="im2col_gemm",
                      workspace_limit=2 * cols, **case.kwargs)
    assert device.count("unfold_im2col") == 3 and device.gemms == 3   # samples (0, 1), (2, 3), (4,)
    numpy.testing.assert_allclose(out, full, rtol=1e-13, atol=1e-13)

    for limit, kernel, chunks in ((grad_input, "fold_col2im", 5), (2 * grad_weight + 1, "unfold_im2col", 3)):
        device, copied = Recorder(), []
        device.copyto = lambda dst, src, device=device: (copied.append(dst.shape), Recorder.copyto(device, dst, src))
        with cupyconv.workspace_limit(limit):  # the scoped global budget
            grads = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight,
                                algorithm="im2col_gemm", **case.kwargs)
        assert device.count(kernel) == chunks, kernel
        assert (1, c, h, w) not in copied, copied   # col2im writes each chunk of grad_input in place
        for got, want in zip(grads, full_grads):
            numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_64_bit_index_variants(monkeypatch):
    """Every kernel's `long long` instantiation runs (the buffers here are small; the choice is forced)."""
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)  # every extent "passes 2^31": long long
    device = Recorder("reverse")
    for algorithm in ALGORITHMS:
        check_case(device, CASE_BY_NAME["groups3_dilation2_asymmetric"], algorithm)
        check_case(device, CASE_BY_NAME["groups2_stride2"], algorithm)
    kernels = {name.split("<")[0] for name in device.launches}
    assert kernels == {"conv_fwd_direct", "conv_bwd_weight_direct", "conv_fwd_bias", "conv_bgrad", "conv_bgrad_sum",
                       "unfold_im2col", "fold_col2im"}
    assert all(name.split(",")[1].strip(" >") == "long long" for name in device.launches), device.launches


def test_every_kernel_once():
    """Each conv.cu kernel (and both unfold kernels) at least once: the ASan run below executes this."""
    device = Recorder("reverse")
    check_case(device, CASE_BY_NAME["everything"], "im2col_gemm")
    check_case(device, CASE_BY_NAME["outputs_per_group_7"], "direct")   # stride 1: direct grad_input too
    assert {name.split("<")[0] for name in device.launches} == {
        "conv_fwd_direct", "conv_bwd_weight_direct", "conv_fwd_bias", "conv_bgrad", "conv_bgrad_sum",
        "unfold_im2col", "fold_col2im"}


def test_every_kernel_clean_under_asan():
    assert_clean_under_asan(pytest_under_asan(f"{__file__}::test_every_kernel_once",
                                              f"{__file__}::test_weight_gradient_ragged_last_split"))


def test_groups_c_routes_to_depthwise():
    case = C("depthwise_route", (2, 4, 7, 6), (8, 1, 3, 3), padding=1, groups=4)
    check_case(EmulatedDevice(), case, "auto")


# ---------------------------------------------------------------------------------------------------------
# Bug classes covered on purpose (issue 12; tests/bug_classes.py, table in tests/emulator/README.md)

#: (weight shape, stride, dilation, groups): stride 1 (grad_input by the direct kernel for 'direct') and a strided,
#: dilated, grouped window (grad_input by GEMM + col2im).
PER_SIDE_WINDOWS = [((4, 3, 3, 3), 1, 1, 1), ((6, 2, 3, 2), (2, 3), (1, 2), 2)]


def per_side_case(window, side, padding, low=(6, 7), n=2):
    weight, stride, dilation, groups = window
    stride, dilation = ref.as_pair(stride), ref.as_pair(dilation)
    size = tuple(bug_classes.touching_size(lo, *args) for lo, args in zip(low, zip(weight[2:], stride, dilation,
                                                                                        padding)))
    return C(f"{side}", (n, weight[1] * groups, *size), weight, stride, padding, dilation, groups)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("window", PER_SIDE_WINDOWS, ids=["k3", "k3x2_stride23_dilation12_groups2"])
def test_padding_per_side_and_last_row_and_column(window, algorithm):
    """Forward and every gradient with each side's padding differing alone, the last window ending on the last
    padded row and column (it reads the last input row and column, and the padding past them where there is)."""
    for k, (side, padding) in enumerate(bug_classes.per_side_paddings(1)):
        device = Recorder("reverse" if k % 2 else "forward")
        check_case(device, per_side_case(window, side, padding), algorithm)
        if algorithm == "direct":
            assert device.count("conv_fwd_direct") == 1 + (window[1] == 1), device.launches
        else:
            assert device.count("unfold_im2col") == 2 and device.count("fold_col2im") == 1, device.launches


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_accumulates_in_float32(dtype):
    """The direct kernels (forward, grad_input as the transposed convolution, grad_weight) on data whose float32
    sums are exact: every result is the float64 one rounded once, which a 16-bit accumulator misses (27 terms)."""
    case = C("exact", (2, 6, 7, 6), (4, 3, 3, 3), padding=((1, 0), (2, 1)), groups=2)
    rng = numpy.random.default_rng(30)
    x, weight, bias = (bug_classes.exact_terms(rng, shape, dtype) for shape in (case.x, case.weight, case.weight[:1]))
    grad_output = bug_classes.exact_terms(rng, case.output_shape, dtype)
    as64 = [a.astype(numpy.float64) for a in (x, weight, bias, grad_output)]
    device = Recorder()
    out = kernel_path(device, cupyconv.conv2d, x, weight, bias, algorithm="direct", **case.kwargs)
    grads = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="direct", **case.kwargs)
    assert device.count("conv_fwd_direct") == 2 and device.count("conv_bgrad") == 0   # the bias: with the weight
    assert device.count("conv_bwd_weight_direct") == 1 and device.count("conv_bgrad_sum") == 1
    bug_classes.assert_rounded_once(out, cupyconv.conv2d(*as64[:3], **case.kwargs), dtype, "forward")
    for name, got, want in zip(NEEDS, grads, cupyconv.conv2d_backward(as64[3], *as64[:2], **case.kwargs)):
        bug_classes.assert_rounded_once(got, want, dtype, f"grad {name}")


@pytest.mark.parametrize("n, channels, h, w", [(7, 3, 20, 30), (40, 5, 3, 4), (1, 700, 2, 3), (3, 1, 33, 33)])
def test_bias_gradient_splits(n, channels, h, w):
    """conv_bgrad's splits by images (uneven ranges), by pixels, both, and none (more channels than BIAS_BLOCKS):
    every split counted once, against a float64 sum; grad_bias poisoned by the emulator before the launch."""
    splits = conv_op.bias_splits(n, channels, h * w)
    rng = numpy.random.default_rng(n + channels)
    grad_output = ref.random(rng, (n, channels, h, w), numpy.dtype("float32"))
    x, weight = numpy.zeros((n, 2, h, w), numpy.float32), numpy.zeros((channels, 2, 1, 1), numpy.float32)
    _, _, got = kernel_path(Recorder(), cupyconv.conv2d_backward, grad_output, x, weight, needs="bias")
    numpy.testing.assert_allclose(got, grad_output.astype(numpy.float64).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)
    assert splits == {(7, 3): (7, 2), (40, 5): (40, 1), (1, 700): (1, 1), (3, 1): (3, 4)}[n, channels]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_bias_gradient_accumulates_in_float32(dtype):
    """conv_bgrad over 1600 pixels (3 channels: split 6 ways by pixels, `bias_splits`): each thread sums a few
    terms 256 apart in a register before the tree, and conv_bgrad_sum adds the 6 splits
    (bug_classes.strided_sum_terms); a 16-bit register anywhere loses the small terms."""
    assert conv_op.bias_splits(1, 3, 1600) == (1, 6)
    values = bug_classes.strided_sum_terms(1600, conv_op.REDUCE_BLOCK, dtype).reshape(40, 40)
    grad_output = numpy.stack([values, -values, values])[None]
    x = numpy.zeros((1, 2, 40, 40), values.dtype)
    weight = numpy.zeros((3, 2, 1, 1), values.dtype)
    device = Recorder()
    _, _, got = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, needs="bias")
    assert device.launches == [f"conv_bgrad<{_kernels.c_type(values.dtype)}, int>",
                               f"conv_bgrad_sum<{_kernels.c_type(values.dtype)}, int>"]
    bug_classes.assert_rounded_once(got, grad_output.astype(numpy.float64).sum(axis=(0, 2, 3)), dtype)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_grid_loops_with_several_blocks(algorithm, monkeypatch):
    """Three blocks for every capped grid (the direct kernel's items; the elementwise bias epilogue, im2col and
    col2im in blocks of 32 threads), each fewer than the work: a loop that starts at threadIdx.x or at item 0,
    or does not stride, leaves outputs unwritten (NaN)."""
    loops = bug_classes.GridLoops(monkeypatch, cap=3)
    device = loops.device(Recorder("reverse"))
    check_case(device, CASE_BY_NAME["everything"], algorithm)       # stride (2, 3): grad_input by col2im
    check_case(device, CASE_BY_NAME["outputs_per_group_7"], algorithm)  # stride 1: 'direct' grad_input direct
    expected = {"conv_fwd_direct"} if algorithm == "direct" else {"conv_fwd_bias", "unfold_im2col"}
    assert loops.looped() == loops.capped() == expected | {"fold_col2im"}, loops.launches


#: A plane whose last rows start past 2^31 ((H - 1) * W > 2^31), and 2^23 + 1 groups of 16 -> 16 channels, whose last
#: weights start past 2^31 (((g * 16 + d) * 16 for the last group).
HUGE_PLANE, HUGE_GROUPS = (40000, 60000), 2**23 + 1


def test_64_bit_indices_past_2_31(monkeypatch):
    """The direct kernel's `long long` instantiations past 2^31 (sparse memory, only the last block of each launch
    runs: bug_classes.SparseDevice): forward and transposed (grad_input) on a 2.4e9-pixel plane, and the forward
    with a 2.1e9-element weight.  Every product of their index arithmetic passes 2^31 there, so one computed in
    `int` overflows, which UBSan turns into a failed launch; what the last block writes matches a crop."""
    bug_classes.lift_grid_cap(monkeypatch)
    rng = numpy.random.default_rng(12)
    h, w = HUGE_PLANE
    rows = 10
    x = bug_classes.sparse_zeros((1, 1, h, w), numpy.float16)
    x[..., -rows:, :] = rng.standard_normal((rows, w))
    weight = rng.standard_normal((2, 1, 3, 3)).astype(numpy.float16)
    device = bug_classes.SparseDevice()
    out = kernel_path(device, cupyconv.conv2d, x, weight, padding=1, algorithm="direct")
    # a crop of the last rows with no padding above: its outputs are the last rows of the whole plane's
    expected = cupyconv.conv2d(x[..., -rows:, :], weight, padding=((0, 1), (1, 1)))
    bug_classes.assert_tail_written(out, expected[0, -1, -1, -1024:], numpy.float16, 32, "forward, plane")
    grad_output = bug_classes.sparse_zeros((1, 2, h, w), numpy.float16)
    grad_output[..., -rows:, :] = rng.standard_normal((2, rows, w))
    (grad_x, _, _) = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, padding=1, needs="input",
                                 algorithm="direct")
    expected = cupyconv.conv2d_backward(grad_output[..., -rows:, :], x[..., -rows:, :], weight, padding=1,
                                        needs="input")[0]
    bug_classes.assert_tail_written(grad_x, expected[..., -1, -1024:], numpy.float16, 32, "grad_input, plane")

    x = bug_classes.sparse_zeros((1, 16 * HUGE_GROUPS, 1, 1), numpy.float16)
    x[:, -16:] = rng.standard_normal((1, 16, 1, 1))
    weight = bug_classes.sparse_zeros((16 * HUGE_GROUPS, 16, 1, 1), numpy.float16)
    weight[-16:] = rng.standard_normal((16, 16, 1, 1))
    out = kernel_path(device, cupyconv.conv2d, x, weight, groups=HUGE_GROUPS, algorithm="direct")
    # one thread a block: an item is 8 of the group's outputs, and the last block writes the last 8
    bug_classes.assert_tail_written(out, cupyconv.conv2d(x[:, -16:], weight[-16:]), numpy.float16, 8,
                                    "forward, weight")
    assert device.launches == ["conv_fwd_direct<__half, long long, 2>"] * 2 + ["conv_fwd_direct<__half, long long, 8>"]


def test_weight_gradient_64_bit_indices_past_2_31(monkeypatch):
    """conv_bwd_weight_direct's `long long` instantiation on the 2.4e9-pixel plane, split as finely as the
    workspace allows, so that the last block (the only one the sparse device runs) owns the plane's last few
    (image, tile) units: it launches clean under UBSan and its split of the sums (the partial column of the last
    split) is the weight gradient of those units' crop."""
    monkeypatch.setattr(conv_op, "WGRAD_BLOCKS", _kernels.MAX_GRID[0])
    rng = numpy.random.default_rng(13)
    h, w = HUGE_PLANE
    x = bug_classes.sparse_zeros((1, 1, h, w), numpy.float32)
    x[..., -20:, :] = rng.standard_normal((20, w))
    weight = rng.standard_normal((2, 1, 3, 3)).astype(numpy.float32)
    grad_output = bug_classes.sparse_zeros((1, 2, h, w), numpy.float32)
    grad_output[..., -20:, :] = rng.standard_normal((2, 20, w))
    partials = []

    class Partials(bug_classes.SparseDevice):
        def launch(self, source, name, grid, block, args, shared_mem=0):
            super().launch(source, name, grid, block, args, shared_mem)
            if name.startswith("conv_bwd_weight_direct"):
                partials.append(args[2])   # (x, grad_output, partial, ...)

    device = Partials()
    kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, padding=1, needs="weight",
                algorithm="direct")
    assert device.launches[0] == "conv_bwd_weight_direct<float, long long>"
    plan = conv_op.plan_weight_direct(conv_op.ConvSpec.for_conv("conv2d", x, weight, None, 1, 1, 1, 1), "float32")
    tiles_x = ceil_div(w, 32)
    units = ceil_div(h, plan.tile_rows) * tiles_x
    last = units - (plan.splits - 1) * plan.units_per_split   # the last split's units: the last tiles of a row band
    assert last <= tiles_x, plan
    rows, first = h - (h - 1) // plan.tile_rows * plan.tile_rows, (tiles_x - last) * 32
    crop = ref.conv2d_grads(grad_output[..., -rows:, first:], x[..., -rows - 1:, first - 1:], weight,
                            padding=((0, 1), (0, 1)))[1]
    numpy.testing.assert_allclose(numpy.asarray(partials[0])[:, -1], crop.reshape(-1), rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# TF32 opt-in and autotuning (their CUDA halves are faked here; the GPU tests below run them for real)


class CudaLikeRecorder(Recorder):
    """CudaDevice's GEMM on the emulator: its exact cuBLAS binding call, made to EmulatedCublas (host memory)."""

    name = "cuda"
    gemm_strided_batched = _device.CudaDevice.gemm_strided_batched
    gemm_prepare = _device.CudaDevice.gemm_prepare
    gemm_run = _device.CudaDevice.gemm_run
    cublas = _device.CudaDevice.cublas
    compute_capability = 80


def test_tf32_is_opt_in_and_scoped(monkeypatch):
    """TF32 is chosen by the cuBLAS compute type of each GEMM: CUBLAS_COMPUTE_32F_FAST_TF32 for float32 under
    allow_tf32 only, never for float64; the handle's math mode is never changed (nothing to restore or leak)."""
    assert cupyconv.get_allow_tf32() is False
    cublas = EmulatedCublas()
    monkeypatch.setattr(_device, "_cublas", lambda: (cublas.get_cublas_handle(), cublas))
    monkeypatch.setattr(_device, "_cuda_runtime", lambda: cublas)
    case = CASE_BY_NAME["groups2_stride2"]
    for allow, dtype, compute in ((False, numpy.float32, cublas.CUBLAS_COMPUTE_32F),
                                  (True, numpy.float32, cublas.CUBLAS_COMPUTE_32F_FAST_TF32),
                                  (True, numpy.float64, cublas.CUBLAS_COMPUTE_64F)):
        cublas.gemms.clear()
        device = CudaLikeRecorder()
        x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(9), dtype)
        with cupyconv.settings.allow_tf32(allow):
            out = kernel_path(device, cupyconv.conv2d, x, weight, bias, algorithm="im2col_gemm", **case.kwargs)
            grads = kernel_path(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="im2col_gemm",
                                **case.kwargs)
        assert device.gemms == 3   # forward, grad input, grad weight; each as cuBLAS calls per group or sample
        assert [g["computeType"] for g in cublas.gemms] == [compute] * len(cublas.gemms) and cublas.gemms
        assert all(g["math_mode"] == cublas.CUBLAS_DEFAULT_MATH for g in cublas.gemms)
        assert cublas.mode == cublas.CUBLAS_DEFAULT_MATH and cublas.pointer_mode == cublas.CUBLAS_POINTER_MODE_HOST
        # EmulatedCublas computes every compute type strictly: the binding's arguments gave the right results
        assert_close(out, cupyconv.conv2d(x, weight, bias, **case.kwargs), numpy.dtype(dtype).name)
        for got, want in zip(grads, cupyconv.conv2d_backward(grad_output, x, weight, **case.kwargs)):
            assert_close(got, want, numpy.dtype(dtype).name)
    cupyconv.set_allow_tf32(True)
    assert cupyconv.get_allow_tf32() is True
    cupyconv.set_allow_tf32(False)


def test_autotune_times_once_and_caches(monkeypatch):
    monkeypatch.setattr(_autotune, "CACHE", {})
    assert cupyconv.get_autotune() is False
    timed = []

    def fake_timed(device, run):  # pretend im2col + GEMM is faster, against the heuristic's choice
        result = run()
        kind = "direct" if device.launches[-1].startswith("conv_fwd_direct") else "im2col_gemm"
        timed.append(kind)
        return (1.0 if kind == "direct" else 0.5), result

    monkeypatch.setattr(Recorder, "timed", fake_timed)
    case = CASE_BY_NAME["plain"]
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(10))
    device = Recorder()
    kernel_path(device, cupyconv.conv2d, x, weight, bias, **case.kwargs)
    assert timed == [] and device.count("conv_fwd_direct") == 1   # off by default: the heuristic

    cupyconv.set_autotune(True)
    try:
        device = Recorder()
        out = kernel_path(device, cupyconv.conv2d, x, weight, bias, **case.kwargs)
        assert timed == ["direct", "im2col_gemm", "direct"]   # the heuristic's pick first and again last
        assert device.count("conv_fwd_direct") == 3 and device.count("unfold_im2col") == 2  # warm-up + timed
        assert_close(out, cupyconv.conv2d(x, weight, bias, **case.kwargs), "float64")
        assert list(_autotune.CACHE.values()) == ["im2col_gemm"]
        device.launches.clear()
        kernel_path(device, cupyconv.conv2d, x, weight, bias, **case.kwargs)  # cached: no timing
        assert len(timed) == 3 and device.count("conv_fwd_direct") == 0 and device.count("unfold_im2col") == 1
    finally:
        cupyconv.set_autotune(False)


# ---------------------------------------------------------------------------------------------------------
# The same matrix on a real GPU (CuPy arrays against the NumPy CPU path)


def on_gpu(fn, *arrays, **kwargs):
    """fn on CuPy copies of the NumPy arrays (None stays None); results back as NumPy arrays."""
    import cupy
    result = fn(*(None if a is None else cupy.asarray(a) for a in arrays), **kwargs)
    if isinstance(result, tuple):
        return tuple(None if r is None else cupy.asnumpy(r) for r in result)
    return cupy.asnumpy(result)


def check_case_gpu(case, algorithm, dtype="float64", seed=0, needs=NEEDS):
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(seed), DTYPES[dtype])
    out = on_gpu(cupyconv.conv2d, x, weight, bias, algorithm=algorithm, **case.kwargs)
    assert out.dtype == x.dtype
    assert_close(out, cupyconv.conv2d(x, weight, bias, **case.kwargs), dtype, f"{case.name}: forward")
    grads = on_gpu(cupyconv.conv2d_backward, grad_output, x, weight, needs=needs, algorithm=algorithm,
                   **case.kwargs)
    for name, got, want in zip(NEEDS, grads, cupyconv.conv2d_backward(grad_output, x, weight, needs=needs,
                                                                      **case.kwargs)):
        if want is None:
            assert got is None, name
        else:
            assert_close(got, want, dtype, f"{case.name}: grad {name}")
    return grads


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ALGORITHMS + ("auto",))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_matches_cpu_path(case, algorithm):
    check_case_gpu(case, algorithm)


#: ResNeXt-like layers for the direct kernels on a GPU: groups of 4 (56-wide: two 32-column tiles, the sliding
#: 3x3 path), 8 (28-wide), 16 on a 14x14 plane (one-warp blocks, 16-column weight-gradient lanes), a strided one
SMALL_GROUP_CASES = [C("rx128_like", (3, 16, 56, 56), (16, 4, 3, 3), padding=1, groups=4),
                     C("rx256_like", (2, 32, 28, 28), (32, 8, 3, 3), padding=1, groups=4),
                     C("rx512_like", (2, 32, 14, 14), (32, 16, 3, 3), padding=1, groups=2),
                     C("strided_dilated", (2, 12, 29, 33), (18, 4, 3, 3), stride=2, padding=2, dilation=2, groups=3)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("case", SMALL_GROUP_CASES, ids=str)
def test_gpu_small_groups(case, dtype):
    """'auto' against the CPU path: the direct kernels wherever the tensor cores refuse (strict float32, or under
    16 channels a group)."""
    check_case_gpu(case, "auto", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_gpu_dtypes(dtype, algorithm):
    check_case_gpu(DTYPE_CASE, algorithm, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("needs", NEEDS_SUBSETS, ids=repr)
def test_gpu_needs(needs):
    check_case_gpu(CASE_BY_NAME["groups2_stride2"], "auto", needs=needs)


@pytest.mark.gpu
def test_gpu_grad_weight_is_bit_deterministic():
    case = C("determinism", (8, 32, 15, 13), (48, 16, 3, 3), padding=1, groups=2)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(7), numpy.float32)
    runs = [on_gpu(cupyconv.conv2d_backward, grad_output, x, weight, needs=("weight", "bias"), **case.kwargs)
            for _ in range(3)]
    for _, gw, gb in runs[1:]:
        assert gw.tobytes() == runs[0][1].tobytes() and gb.tobytes() == runs[0][2].tobytes()


@pytest.mark.gpu
def test_gpu_workspace_budget_chunks_the_batch():
    case = C("chunked", (5, 3, 6, 7), (4, 3, 3, 3), padding=1)
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(8))
    full = on_gpu(cupyconv.conv2d, x, weight, bias, algorithm="im2col_gemm", **case.kwargs)
    chunked = on_gpu(cupyconv.conv2d, x, weight, bias, algorithm="im2col_gemm", workspace_limit=3000,
                     **case.kwargs)
    numpy.testing.assert_allclose(chunked, full, rtol=1e-13, atol=1e-13)
    full_grads = on_gpu(cupyconv.conv2d_backward, grad_output, x, weight, **case.kwargs)
    chunked_grads = on_gpu(cupyconv.conv2d_backward, grad_output, x, weight, workspace_limit=3000, **case.kwargs)
    for got, want in zip(chunked_grads, full_grads):
        numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_gpu_tf32_opt_in_restores_the_math_mode():
    import cupy
    handle, cublas = _device._cublas()
    before = cublas.getMathMode(handle)
    case = C("tf32", (4, 64, 17, 17), (64, 64, 3, 3), padding=1)
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(11), numpy.float32)
    strict = on_gpu(cupyconv.conv2d, x, weight, bias, algorithm="im2col_gemm", **case.kwargs)
    cupyconv.set_allow_tf32(True)
    try:
        out = on_gpu(cupyconv.conv2d, x, weight, bias, algorithm="im2col_gemm", **case.kwargs)
    finally:
        cupyconv.set_allow_tf32(False)
    assert cublas.getMathMode(handle) == before
    # TF32 keeps 10 mantissa bits of each factor: a relative error of about 1e-3 at most.
    expected = cupyconv.conv2d(x, weight, bias, **case.kwargs)
    assert_close(strict, expected, "float32", "strict float32")
    assert float(numpy.abs(out - expected).max()) <= 5e-3 * float(numpy.abs(expected).max())
    if int(cupy.cuda.Device().compute_capability) >= 80:  # TF32 tensor cores exist: the flag must change bits
        assert not numpy.array_equal(out, strict), "set_allow_tf32(True) did not change the float32 GEMMs"


@pytest.mark.gpu
def test_gpu_torch_tensors():
    torch = ref.cuda_torch()
    case = CASE_BY_NAME["groups2_stride2"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(12), numpy.float32)
    t = [torch.from_numpy(a).cuda() for a in (x, weight, bias, grad_output)]
    out = cupyconv.conv2d(t[0], t[1], t[2], **case.kwargs)
    assert isinstance(out, torch.Tensor) and out.is_cuda
    assert_close(out.cpu().numpy(), cupyconv.conv2d(x, weight, bias, **case.kwargs), "float32")
