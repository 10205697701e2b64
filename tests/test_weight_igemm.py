"""The channels-last tensor-core weight gradient (raw_kernels/implicit_gemm.cu conv_bwd_weight_igemm and its final
pass conv_bwd_weight_igemm_finish; cupyconv/ops/implicit_gemm.py's "weight gradient, channels-last" section) on
the emulator: against the CPU path in float64 across tile edges, splits and layouts; the bias gradient it sums on
the way; bit-identical results whatever the block order; the fallback to conv_bwd_weight_tc; and the emulated
memory counters of its main loop (cp.async and ldmatrix).  tests/test_tensor_core_sweep.py runs it too (its
specs from VECTORISED_FROM on).
"""
import numpy
import pytest

import cupyconv
from cupyconv import _device, _kernels, settings
from cupyconv.ops import implicit_gemm as igemm
from bug_classes import Recorder
from emulator import EmulatedDevice
from optional_deps import BFLOAT16, Dtypes
from reference import ConvCase

C = ConvCase
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32})
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-3}  # as tests/test_tensor_core_kernels.py

CASES = [
    # 40 outputs: a 64-row tile with its last 24 rows past M; 9 x 24 = 216 columns: 4 column tiles, the last short
    C("wg_tile_edges", (2, 24, 9, 11), (40, 24, 3, 3), padding=((1, 0), (2, 1))),
    # stride and dilation differ per axis, 2 groups of 16 -> 8 (the 32-row tile), a 2 x 3 kernel
    C("wg_groups_stride_dilation", (3, 32, 13, 10), (16, 16, 2, 3), stride=(2, 1), dilation=(1, 3),
      padding=((0, 1), (3, 0)), groups=2),
    # 136 outputs per group: the 128-row tile of 16-bit inputs and a second, nearly empty row tile
    C("wg_wide_rows", (2, 16, 12, 13), (136, 16, 1, 2), stride=(1, 2)),
    # 136 outputs, 16 x 16 = 256 columns: the 128 x 128 tile of 16-bit inputs (warps of 64 x 32)
    C("wg_wide_tile", (3, 16, 7, 9), (136, 16, 4, 4), padding=((2, 1), (1, 2)), dilation=(1, 2)),
]
CASE_BY_NAME = {case.name: case for case in CASES}


def on_emulator(device, fn, *args, **kwargs):
    with _device.use_device(device), settings.allow_tf32(True):
        return fn(*args, **kwargs)


def assert_close(got, want, dtype, what):
    got, want = numpy.asarray(got, numpy.float64), numpy.asarray(want, numpy.float64)
    scale = max(float(numpy.abs(want).max(initial=0.0)), 1e-30)
    err = float(numpy.abs(got - want).max(initial=0.0))  # NaN (an element never written) fails too
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


def backward(device, case, dtype, seed, x_layout="contiguous"):
    rng = numpy.random.default_rng(seed)
    x, weight, _, grad_output = case.inputs(rng, DTYPES[dtype])
    if x_layout == "negative":  # channels and columns reversed: x_cl's copy must undo both
        x = numpy.ascontiguousarray(x[:, ::-1, :, ::-1])[:, ::-1, :, ::-1]
    grads = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, needs=("weight", "bias"),
                        algorithm="implicit_gemm", **case.kwargs)
    want = cupyconv.conv2d_backward(*(a.astype(numpy.float64) for a in (grad_output, x, weight)),
                                    needs=("weight", "bias"), **case.kwargs)
    return grads, want


def several_splits(monkeypatch, chunks_per_split):
    """The planner splits the pixels into chunks_per_split chunks each (the last one short)."""
    monkeypatch.setattr(igemm, "TC_SPLIT_BLOCKS", 10**6)
    monkeypatch.setattr(igemm, "TC_SPLIT_CHUNKS", chunks_per_split)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_cpu_path(monkeypatch, case, dtype):
    if dtype == "float32" and case.name.startswith("wg_wide"):
        pytest.skip("float32 has no 128-row tile")
    several_splits(monkeypatch, 2)
    device = Recorder()
    (_, grad_w, grad_b), (_, want_w, want_b) = backward(device, case, dtype, seed=11)
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(case.x, numpy.float16),
                                               numpy.empty(case.weight), None, **case.kwargs)
    plan = igemm.plan_weight_igemm(spec, DTYPES[dtype])
    assert plan.splits >= 2 and plan.chunks_per_split >= 2  # several splits of several chunks
    assert plan.grid[1] > case.kwargs.get("groups", 1) or case.name.startswith("wg_wide")
    assert plan.tile == {"wg_tile_edges": (64, 64), "wg_groups_stride_dilation": (32, 64),
                         "wg_wide_rows": (128, 64), "wg_wide_tile": (128, 128)}[case.name]
    names = [name.split("<")[0] for name in device.launches]
    assert names.count("conv_bwd_weight_igemm") == 1 and "conv_bwd_weight_igemm_finish" not in names  # finished in it
    assert "conv_bwd_weight_tc" not in names and "conv_bgrad" not in names  # the bias came with the weight
    assert grad_w.dtype == grad_b.dtype == DTYPES[dtype] and grad_w.shape == case.weight
    assert_close(grad_w, want_w, dtype, "grad_weight")
    assert_close(grad_b, want_b, dtype, "grad_bias")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_64_bit_index_and_negative_strides(monkeypatch, dtype):
    """The `long long` instantiations (INT32_MAX -1), x with reversed channels and columns."""
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    several_splits(monkeypatch, 3)
    device = Recorder()
    case = CASE_BY_NAME["wg_groups_stride_dilation"]
    (_, grad_w, grad_b), (_, want_w, want_b) = backward(device, case, dtype, seed=12, x_layout="negative")
    assert any(name.startswith("conv_bwd_weight_igemm<") and ", long long, " in name for name in device.launches)
    assert_close(grad_w, want_w, dtype, "grad_weight")
    assert_close(grad_b, want_b, dtype, "grad_bias")


def test_other_channel_counts_take_the_generic_kernel():
    """20 input channels per group are not whole 16-byte copies of float16: conv_bwd_weight_tc and conv_bgrad."""
    case = C("wg_generic", (2, 20, 6, 5), (16, 20, 3, 3), padding=1)
    device = Recorder()
    (_, grad_w, grad_b), (_, want_w, want_b) = backward(device, case, "float16", seed=13)
    assert device.count("conv_bwd_weight_tc") == 1 and device.count("conv_bgrad") == 1
    assert device.count("conv_bwd_weight_igemm") == 0
    assert_close(grad_w, want_w, "float16", "grad_weight")
    assert_close(grad_b, want_b, "float16", "grad_bias")
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(case.x, numpy.float16), numpy.empty(case.weight),
                                               None, **case.kwargs)
    assert "16-byte copy" in igemm.weight_igemm_refusal(spec, numpy.float16)
    assert igemm.weight_igemm_refusal(spec, numpy.float32) is None  # 20 = 5 copies of 4 floats


def test_tf32_bias_keeps_float_precision():
    """float32 on TF32: the bias gradient sums grad_output's tf32 part and its remainder's, so it keeps about
    float's precision (tf32 alone, 10 mantissa bits, misses by ~1e-4 of the largest value here)."""
    case = CASE_BY_NAME["wg_tile_edges"]
    (_, _, grad_b), (_, _, want_b) = backward(Recorder(), case, "float32", seed=18)
    scale = float(numpy.abs(want_b).max())
    assert float(numpy.abs(numpy.asarray(grad_b, numpy.float64) - want_b).max()) <= 1e-6 * scale


def test_weight_only_needs_no_bias_sum(monkeypatch):
    """needs=('weight',): has_bias 0, no grad_bias computed, the same weight gradient bits."""
    case = CASE_BY_NAME["wg_tile_edges"]
    rng = numpy.random.default_rng(14)
    x, weight, _, grad_output = case.inputs(rng, numpy.float16)
    kwargs = dict(algorithm="implicit_gemm", **case.kwargs)
    _, both, _ = on_emulator(Recorder(), cupyconv.conv2d_backward, grad_output, x, weight, needs=("weight", "bias"),
                             **kwargs)
    _, alone, none = on_emulator(Recorder(), cupyconv.conv2d_backward, grad_output, x, weight, needs=("weight",),
                                 **kwargs)
    assert none is None and alone.tobytes() == both.tobytes()


def tf32(a):
    """float32 a rounded to tf32 as cvt.rna does (nearest, ties away from zero), as float64."""
    bits = numpy.asarray(a, numpy.float32).view(numpy.uint32).astype(numpy.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(numpy.uint32).view(numpy.float32).astype(numpy.float64)


def test_tf32_operands_are_rounded_once_to_nearest():
    """float32 on TF32: grad_weight is the float64 GEMM of x and grad_output each rounded to tf32 to nearest
    (once, by their channels-last copies; the fragments are the staged words), to float32's accumulation error:
    operands left unrounded (the mma would truncate them) or rounded twice differ by ~1e-4 of the largest value;
    the bias gradient keeps float's precision (the remainder staged beside grad_output).  One launch copies x,
    and grad_output with its remainder (channels_last_copies)."""
    case = CASE_BY_NAME["wg_groups_stride_dilation"]
    rng = numpy.random.default_rng(19)
    x, weight, _, grad_output = case.inputs(rng, numpy.float32)
    device = Recorder("reverse")
    _, gw, gb = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, needs=("weight", "bias"),
                            algorithm="implicit_gemm", **case.kwargs)
    assert device.count("conv_bwd_weight_igemm") == 1 and device.copies() == ["channels_last_copies"], device.launches
    _, want_w, want_b = cupyconv.conv2d_backward(tf32(grad_output), tf32(x), weight.astype(numpy.float64),
                                                 needs=("weight", "bias"), **case.kwargs)
    _, _, exact_b = cupyconv.conv2d_backward(grad_output.astype(numpy.float64), x.astype(numpy.float64),
                                             weight.astype(numpy.float64), needs=("bias",), **case.kwargs)
    scale = float(numpy.abs(want_w).max())
    assert float(numpy.abs(numpy.asarray(gw, numpy.float64) - want_w).max()) <= 2e-6 * scale
    assert float(numpy.abs(numpy.asarray(gb, numpy.float64) - exact_b).max()) <= 1e-6 * float(numpy.abs(exact_b).max())


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_bits_are_the_same_whatever_the_block_order(monkeypatch, dtype):
    """Several splits of several chunks, blocks run in forward and reverse order: the same grad_weight and
    grad_bias bits (float32 split sums added in split order, no atomics)."""
    several_splits(monkeypatch, 2)
    case = CASE_BY_NAME["wg_tile_edges"]
    runs = []
    for order in ("forward", "reverse", "forward"):
        (_, gw, gb), _ = backward(EmulatedDevice(order), case, dtype, seed=15)
        runs.append((gw.tobytes(), gb.tobytes()))
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_main_loop_counters():
    """r50-64's 3x3 64 -> 64 layer at 28 x 28, float16, two blocks of the 64 x 64 tile (one in the first column
    tile, which also sums the bias): the 16-byte cp.async reads use every sector they fetch, and every shared
    access of the main loop (the copies landing, ldmatrix .trans, the bias sums) is free of bank conflicts."""
    rng = numpy.random.default_rng(16)
    x = rng.standard_normal((1, 64, 28, 28)).astype(numpy.float16)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(numpy.float16)
    gy = rng.standard_normal((1, 64, 28, 28)).astype(numpy.float16)
    device = EmulatedDevice(counters=True, blocks=lambda grid: [(0, 3, 1), (0, 0, 2)] if grid[1] > 3 and grid[2] > 2 else [(0, 0, 0)])
    on_emulator(device, cupyconv.conv2d_backward, gy, x, w, padding=1, needs=("weight", "bias"),
                algorithm="implicit_gemm")
    profile = next(p for p in device.profile if p.name.startswith("conv_bwd_weight_igemm<"))
    assert profile.name == "conv_bwd_weight_igemm<__half, int, 64, 64>" and profile.blocks_run == 2
    shared = [s for s in profile.sites if s.kind.startswith("shared")]
    ldmatrix = [s for s in shared if s.kind == "shared_load" and s.width == 16]
    warps = 4  # 25 chunks of 32 pixels in 3 splits of 9: the blocks of splits 1 and 2 run 9 and 7 chunks, and
    # each warp 2 k steps of 2 + 2 ldmatrix.x4 per chunk
    assert len(ldmatrix) == 2 and sum(s.requests for s in ldmatrix) == (9 + 7) * warps * 2 * 4
    for s in shared:  # the fewest wavefronts a warp's request can take: 16-byte accesses by quarter warps
        assert s.wavefronts_per_request == (4.0 if s.width == 16 else 1.0), s
    copies = [s for s in profile.sites if s.kind == "global_load" and s.width == 16]
    assert len(copies) == 2  # (the other global load: the arrival count's atomic, 4 bytes once per block)
    assert [s.width for s in profile.sites if s.kind == "global_load" and s.width != 16] == [4]
    for s in copies:
        assert s.sector_efficiency >= 0.95, s


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_matches_cpu_path_and_is_bit_deterministic(dtype):
    """On a GPU: the CPU path's gradients within the tolerance, and the same bits in three runs (r50-like 3 x 3,
    32 -> 48 channels in 2 groups, 8 images: several splits)."""
    import cupy
    case = C("wg_gpu", (8, 32, 15, 13), (48, 16, 3, 3), padding=1, groups=2)
    rng = numpy.random.default_rng(17)
    x, weight, _, grad_output = case.inputs(rng, DTYPES[dtype])
    runs = []
    for _ in range(3):
        with settings.allow_tf32(True):
            _, gw, gb = cupyconv.conv2d_backward(cupy.asarray(grad_output), cupy.asarray(x), cupy.asarray(weight),
                                                 needs=("weight", "bias"), algorithm="implicit_gemm", **case.kwargs)
        runs.append((cupy.asnumpy(gw), cupy.asnumpy(gb)))
    want = cupyconv.conv2d_backward(*(a.astype(numpy.float64) for a in (grad_output, x, weight)),
                                    needs=("weight", "bias"), **case.kwargs)
    assert_close(runs[0][0], want[1], dtype, "grad_weight")
    assert_close(runs[0][1], want[2], dtype, "grad_bias")
    for gw, gb in runs[1:]:
        assert gw.tobytes() == runs[0][0].tobytes() and gb.tobytes() == runs[0][1].tobytes()


@pytest.mark.parametrize("keep", [True, False])
def test_a_training_step_copies_x_once(monkeypatch, keep):
    """A torch training step (cupyconv.torch.conv2d forward, then backward) on the emulator, float16, x NCHW: the
    forward's channels-last copy of x is what autograd saves for the weight gradient (`saved_x`), which reads it
    in place: x is copied once (the forward's launch copies x and the weight, the backward's grad_output, and x
    again when the copy is not kept: one launch each pass); the gradients match the CPU path."""
    torch = pytest.importorskip("torch")
    import cupyconv.torch as cupyconv_torch
    from cupyconv.torch import _custom_ops, cpu as torch_cpu
    if not keep:
        monkeypatch.setattr(_custom_ops, "KEEPS_X_COPY", ())
    case = CASE_BY_NAME["wg_tile_edges"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(20), numpy.float16)
    w = torch.from_numpy(weight).requires_grad_()
    b = torch.from_numpy(bias).requires_grad_()
    device = Recorder("reverse")
    with torch_cpu.numpy_cpu_path(True), _device.use_device(device), settings.allow_tf32(True):
        y = cupyconv_torch.conv2d(torch.from_numpy(x), w, b, algorithm="implicit_gemm", **case.kwargs)
        assert device.count("conv_fwd_igemm") == 1 and device.copies() == ["channels_last_copies"], device.launches
        assert _custom_ops._LAST_X_COPY.slot is None   # taken by autograd's setup_context
        y.backward(torch.from_numpy(grad_output))
        assert device.count("conv_bwd_weight_igemm") == 1, device.launches
        backward = "channels_last_copy" if keep else "channels_last_copies"   # grad_output (and x)
        assert device.copies() == ["channels_last_copies", backward], device.launches
        with torch.no_grad():
            y = cupyconv_torch.conv2d(torch.from_numpy(x), w, b, algorithm="implicit_gemm", **case.kwargs)
        held = _custom_ops._LAST_X_COPY.slot   # no autograd: held (the one slot) until the next forward
        assert (held is not None and held[0]() is y) == keep
    _, want_w, want_b = cupyconv.conv2d_backward(*(a.astype(numpy.float64) for a in (grad_output, x, weight)),
                                                 needs=("weight", "bias"), **case.kwargs)
    assert_close(w.grad.numpy(), want_w, "float16", "grad_weight")
    assert_close(b.grad.numpy(), want_b, "float16", "grad_bias")


def test_the_kept_x_copy_never_cuts_a_second_order_gradient_off_x():
    """d/dx of an expression of the weight gradient (create_graph: MAML's inner step, a penalty on the weight
    gradient) on the emulator, float16, x NCHW requiring grad: the forward keeps its channels-last copy of x, but
    autograd must not save it in place of an x that requires grad (the copy has no grad_fn: the term of gw's
    dependence on x would be lost, silently None).  Matches torch's float64 convolution's second-order gradient."""
    torch = pytest.importorskip("torch")
    import cupyconv.torch as cupyconv_torch
    from cupyconv.torch import cpu as torch_cpu
    case = CASE_BY_NAME["wg_tile_edges"]   # padding ((1, 0), (2, 1))
    rng = numpy.random.default_rng(22)
    x, weight, _, grad_output = case.inputs(rng, numpy.float16)
    probe = rng.standard_normal(weight.shape).astype(numpy.float16)
    xr, wr = (torch.from_numpy(a).double().requires_grad_() for a in (x, weight))
    yr = torch.nn.functional.conv2d(torch.nn.functional.pad(xr, (2, 1, 1, 0)), wr)
    (gwr,) = torch.autograd.grad(yr, wr, torch.from_numpy(grad_output).double(), create_graph=True)
    (want,) = torch.autograd.grad((gwr * torch.from_numpy(probe).double()).sum(), xr)
    xt, w = (torch.from_numpy(a).requires_grad_() for a in (x, weight))
    device = Recorder("reverse")
    with torch_cpu.numpy_cpu_path(True), _device.use_device(device), settings.allow_tf32(True):
        y = cupyconv_torch.conv2d(xt, w, algorithm="implicit_gemm", **case.kwargs)
        assert device.copies() == ["channels_last_copies"]   # the forward's copy of x (and of the weight)
        (gw,) = torch.autograd.grad(y, w, torch.from_numpy(grad_output), create_graph=True)
        (got,) = torch.autograd.grad((gw * torch.from_numpy(probe)).sum(), xt, allow_unused=True)
    assert got is not None, "d/dx of the weight gradient was cut off x"
    assert_close(got.numpy(), want.numpy(), "float16", "d/dx <grad_weight, probe>")


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_a_channels_last_grad_output_is_read_in_place(monkeypatch, layout):
    """conv2d_backward on the tensor cores takes grad_output in its own layout: a channels-last grad_output (what
    the forward returns for channels-last x) is read in place by the input and the weight gradient -- two
    copies (the input gradient's weight, x) and no array-library copy; an NCHW one is copied to channels-last once,
    shared by both gradients (three copies); one launch copies them all.  Both match the float64 reference."""
    case = CASE_BY_NAME["wg_tile_edges"]
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(21), numpy.float16)
    if layout == "channels_last":
        grad_output = numpy.ascontiguousarray(grad_output.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    device = Recorder("reverse")
    copies = []
    monkeypatch.setattr(device, "copyto", lambda out, a: (copies.append(numpy.shape(a)),   # (a fill: ())
                                                          EmulatedDevice.copyto(device, out, a)))
    with _device.use_device(device):
        grad_x, grad_w, _ = cupyconv.conv2d_backward(grad_output, x, weight, needs=("input", "weight"),
                                                     algorithm="implicit_gemm", **case.kwargs)
    assert device.count("conv_fwd_igemm") == 1 and device.count("conv_bwd_weight_igemm") == 1, device.launches
    assert device.copies() == ["channels_last_copies"], device.launches
    assert grad_output.shape not in copies, copies
    want_x, want_w, _ = cupyconv.conv2d_backward(*(a.astype(numpy.float64) for a in (grad_output, x, weight)),
                                                 needs=("input", "weight"), **case.kwargs)
    assert_close(grad_x, want_x, "float16", "grad_input")
    assert_close(grad_w, want_w, "float16", "grad_weight")


def separate_copies(monkeypatch):
    """The copies as before channels_last_copies: a channels_last_copy launch each, and no staging of a backward's
    copies ahead of its gradients."""
    from cupyconv.ops import conv as conv_op, patch as patch_op
    monkeypatch.setattr(igemm, "_copies_launch", lambda device, jobs, rounds: [
        igemm._channels_last_copy(device, xv, out, rounds, rest, index) for _, out, rest, xv, index in jobs])
    for module in (conv_op, patch_op):
        monkeypatch.setattr(module, "stage_backward_copies", lambda *args: None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [CASE_BY_NAME["wg_tile_edges"], CASE_BY_NAME["wg_groups_stride_dilation"],
                                  C("wg_patches", (2, 3, 16, 5, 4), (24, 16, 3, 3), padding=1)], ids=str)
def test_copies_in_one_launch_keep_the_bits(monkeypatch, case, dtype):
    """A forward and a backward of every gradient (bias included: float32's fused bias sum takes grad_output's tf32
    remainder from the staged copy) with each pass's channels-last copies in one channels_last_copies launch (the
    forward's: x and the weight; the backward's: grad_output, the weight arranged for the input gradient and x),
    conv2d (stride 1, and 2 x 1 by phases) and patch_conv2d: bit for bit what a copy a launch gives."""
    rng = numpy.random.default_rng(23)
    x, weight, bias, grad_output = case.inputs(rng, DTYPES[dtype])
    patch = x.ndim == 5
    forward = cupyconv.patch_conv2d if patch else cupyconv.conv2d
    backward = cupyconv.patch_conv2d_backward if patch else cupyconv.conv2d_backward
    if patch:
        grad_output = rng.standard_normal(forward(x, weight, **case.kwargs).shape).astype(x.dtype)

    def results(device):
        with _device.use_device(device), settings.allow_tf32(True):
            y = forward(x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
            copies = device.copies()
            grads = backward(grad_output, x, weight, needs=("input", "weight", "bias"), algorithm="implicit_gemm",
                             **case.kwargs)
        return [y, *grads], copies, device.copies()[len(copies):]
    got, forward_copies, backward_copies = results(Recorder("reverse"))
    assert forward_copies == ["channels_last_copies"] and backward_copies == ["channels_last_copies"]
    separate_copies(monkeypatch)
    want, forward_copies, backward_copies = results(Recorder("reverse"))
    assert forward_copies == ["channels_last_copy"] * 2 and len(backward_copies) >= 3, backward_copies
    for g, w, what in zip(got, want, ("y", "grad_x", "grad_weight", "grad_bias")):
        assert g.dtype == w.dtype and g.shape == w.shape, what
        numpy.testing.assert_array_equal(g.view(numpy.uint8), w.view(numpy.uint8), err_msg=what)


# ---------------------------------------------------------------------------------------------------------
# The splits finished in the kernel (issue 24, deliverable 5): the last block of each tile to arrive adds the splits
# in order (implicit_gemm.cu's wg_last_arrival), with the bits of the separate final pass it replaced


class SeparateFinish(Recorder):
    """After each weight-gradient launch, the separate final pass (conv_bwd_weight_igemm_finish, which finished the
    splits before) runs on the same partial sums into arrays of its own: `finished` [(grad_weight, grad_bias)]."""

    WEIGHT_KERNELS = ("conv_bwd_weight_igemm<", "conv_bwd_weight_igemm_groups<")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.finished, self.arrival_arrays = [], []

    def launch(self, source, name, grid, block, args, shared_mem=0):
        super().launch(source, name, grid, block, args, shared_mem)
        if not name.startswith(self.WEIGHT_KERNELS):
            return
        partial, bias_partial, grad_w, grad_b, arrivals = args[3:8]
        self.arrival_arrays.append(arrivals)
        weight, bias = self.empty(grad_w.shape, grad_w.dtype), self.empty(grad_b.shape, grad_b.dtype)
        has_bias = int(args[-1])
        igemm.KERNELS.launch(self, "conv_bwd_weight_igemm_finish", dtype=grad_w.dtype,
                             index="long long" if ", long long," in name else "int", grid=3, block=64,
                             partial=partial, bias_partial=bias_partial, grad_weight=weight,
                             grad_bias=bias if has_bias else weight, splits=grid[2], out_channels=grad_w.shape[0],
                             channels_per_group=grad_w.shape[1], taps=grad_w.shape[2] * grad_w.shape[3],
                             has_bias=has_bias, **igemm.IN_PLACE)
        self.finished.append((weight, bias if has_bias else None))


def shuffled_blocks(seed):
    """`blocks=` running every block in a shuffled order: the last split of a tile to arrive is any split."""
    def blocks(grid):
        every = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
        numpy.random.default_rng(seed).shuffle(every)
        return every
    return blocks


FINISH_CASES = [CASE_BY_NAME["wg_tile_edges"], CASE_BY_NAME["wg_wide_tile"],
                C("wg_groups_of_16", (2, 64, 9, 7), (64, 16, 3, 3), padding=((2, 0), (1, 1)), groups=4)]


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
@pytest.mark.parametrize("chunks", [None, 1, 3])
@pytest.mark.parametrize("case, dtype", [(FINISH_CASES[0], "float16"), (FINISH_CASES[0], "float32"),
                                         (FINISH_CASES[1], "bfloat16"), (FINISH_CASES[2], "float16"),
                                         (FINISH_CASES[2], "float32")], ids=str)
def test_splits_finished_in_the_kernel_keep_the_separate_pass_bits(monkeypatch, case, dtype, chunks, order):
    """One split (chunks None: the default plan of these small problems) or splits of 1 and 3 chunks; blocks in
    forward, reverse (the last to arrive is split 0) and shuffled order: grad_weight and grad_bias are the bits of
    the separate final pass on the same partial sums, match the float64 reference, and the arrival counts are
    back at 0 (no final pass launched).  Groups of 16 run conv_bwd_weight_igemm_groups."""
    if chunks is not None:
        several_splits(monkeypatch, chunks)
    device = SeparateFinish("reverse" if order == "reverse" else "forward",
                            blocks=shuffled_blocks(chunks or 0) if order == "shuffled" else None)
    (_, grad_w, grad_b), (_, want_w, want_b) = backward(device, case, dtype, seed=31)
    names = [name.split("<")[0] for name in device.launches]
    assert names.count("conv_bwd_weight_igemm_finish") == 1 and len(device.finished) == 1, names   # (ours)
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(case.x, numpy.float16), numpy.empty(case.weight),
                                               None, **case.kwargs)
    several = igemm.groups_igemm_refusal(spec, DTYPES[dtype]) is None
    assert several == (case is FINISH_CASES[2])
    plan = (igemm.plan_weight_igemm_groups if several else igemm.plan_weight_igemm)(spec, DTYPES[dtype])
    assert plan.splits == 1 if chunks is None else plan.splits > 1 or chunks == 3, plan
    finished_w, finished_b = device.finished[0]
    assert grad_w.tobytes() == finished_w.tobytes() and grad_b.tobytes() == finished_b.tobytes()
    assert not device.arrival_arrays[0].any()
    assert_close(grad_w, want_w, dtype, "grad_weight")
    assert_close(grad_b, want_b, dtype, "grad_bias")


@pytest.mark.parametrize("case, dtype, chunks", [(FINISH_CASES[0], "float16", 2), (FINISH_CASES[0], "float32", 4)],
                         ids=str)
def test_a_short_last_trip_of_splits_keeps_the_bits(monkeypatch, case, dtype, chunks):
    """The last block of the 64 x 64 tile reads two splits a trip (`wg_finish`, `weight_finish_splits`: 32
    elements a thread): an odd split count, whose last trip reads one (none past the last split), keeps the
    separate pass's bits."""
    several_splits(monkeypatch, chunks)
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(case.x, numpy.float16), numpy.empty(case.weight),
                                               None, **case.kwargs)
    several, plan, finish = igemm.weight_igemm_plan(spec, DTYPES[dtype])
    args = ["float" if dtype == "float32" else "__half", "int", *map(str, plan.tile)]
    trip = igemm.weight_finish_splits("conv_bwd_weight_igemm", args, igemm.weight_igemm_threads(plan.tile))
    assert not several and finish and trip == 2 and plan.splits % 2 == 1 and plan.splits > 1, (plan, trip)
    test_splits_finished_in_the_kernel_keep_the_separate_pass_bits(monkeypatch, case, dtype, chunks, "shuffled")


@pytest.mark.parametrize("kernel_case", [FINISH_CASES[0], FINISH_CASES[2]], ids=str)
def test_arrival_counts_are_reused_and_left_at_zero(monkeypatch, kernel_case):
    """Two calls on one device count in its one kept array (made once), both finish their tiles (a count not set
    back to 0 would leave the second call's weight unwritten: NaN) with the same bits, weight only and with bias."""
    several_splits(monkeypatch, 2)
    device = SeparateFinish()
    made = []
    zeros = device.zeros
    monkeypatch.setattr(device, "zeros", lambda shape, dtype: made.append(shape) or zeros(shape, dtype))
    runs = []
    for needs in (("weight", "bias"), ("weight",), ("weight", "bias")):
        x, weight, _, grad_output = kernel_case.inputs(numpy.random.default_rng(32), numpy.float16)
        runs.append(on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, needs=needs,
                                algorithm="implicit_gemm", **kernel_case.kwargs))
    assert len({id(a) for a in device.arrival_arrays}) == 1 and made.count((_device.ARRIVALS_LEAST,)) == 1
    assert not device.arrival_arrays[0].any()
    assert runs[0][1].tobytes() == runs[1][1].tobytes() == runs[2][1].tobytes()
    assert runs[0][2].tobytes() == runs[2][2].tobytes() and runs[1][2] is None
    assert not numpy.isnan(numpy.asarray(runs[1][1], numpy.float64)).any()


def test_arrival_counts_are_kept_per_stream():
    """Each stream (`stream_key`) gets its own counts, so two launches in flight on different streams never count
    in one array; a larger request replaces the stream's array."""
    class Streams(EmulatedDevice):
        stream = 0

        def stream_key(self):
            return self.stream

    device = Streams()
    first = device.arrival_counters(10)
    assert first.dtype == numpy.int32 and first.size == _device.ARRIVALS_LEAST and not first.any()
    assert device.arrival_counters(5) is first
    device.stream = 1
    other = device.arrival_counters(10)
    assert other is not first
    device.stream = 0
    assert device.arrival_counters(10) is first
    bigger = device.arrival_counters(_device.ARRIVALS_LEAST + 1)
    assert bigger.size == _device.ARRIVALS_LEAST + 1 and not bigger.any() and device.arrival_counters(3) is bigger


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_one_long_split_with_bias(monkeypatch, dtype):
    """One split of 50 chunks (one block per tile) summing the bias: the bias warps issue more tensor-core steps per
    chunk than the others, so without wg_pipeline's barrier per chunk the others run chunks ahead and read stages
    the bias warps' threads have not refilled yet (the emulator keeps warps in step only at warp operations)."""
    monkeypatch.setattr(igemm, "TC_SPLIT_BLOCKS", 1)
    case = C("wg_long_split", (1, 16, 40, 40), (16, 16, 3, 3), padding=1)
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(case.x, numpy.float16), numpy.empty(case.weight),
                                               None, **case.kwargs)
    plan = igemm.plan_weight_igemm(spec, DTYPES[dtype])
    assert plan.splits == 1 and plan.chunks_per_split >= 50, plan
    (_, grad_w, grad_b), (_, want_w, want_b) = backward(Recorder(), case, dtype, seed=33)
    assert_close(grad_w, want_w, dtype, "grad_weight")
    assert_close(grad_b, want_b, dtype, "grad_bias")


@pytest.mark.parametrize("case, dtype", [(FINISH_CASES[0], "float16"), (FINISH_CASES[2], "float32")], ids=str)
def test_a_long_last_read_keeps_the_final_pass(monkeypatch, case, dtype):
    """Splits whose last block would read more than WG_FINISH_BYTES of sums (here: any) leave them to
    conv_bwd_weight_igemm_finish: the kernel writes its sums and returns (no count taken), the final pass runs,
    and the bits are those of the finish in the kernel."""
    several_splits(monkeypatch, 1)
    runs = []
    for limit in (igemm.WG_FINISH_BYTES, 0):
        monkeypatch.setattr(igemm, "WG_FINISH_BYTES", limit)
        device = SeparateFinish("reverse")
        (_, grad_w, grad_b), (_, want_w, want_b) = backward(device, case, dtype, seed=34)
        names = [name.split("<")[0] for name in device.launches]
        assert names.count("conv_bwd_weight_igemm_finish") == (2 if limit == 0 else 1), names   # (+ ours)
        assert not device.arrival_arrays[0].any()
        runs.append((grad_w.tobytes(), grad_b.tobytes()))
        assert_close(grad_w, want_w, dtype, "grad_weight")
        assert_close(grad_b, want_b, dtype, "grad_bias")
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(case.x, numpy.float16), numpy.empty(case.weight),
                                               None, **case.kwargs)
    assert igemm.weight_igemm_plan(spec, DTYPES[dtype])[1].splits > 1
    assert runs[0] == runs[1]


# 720 pixels: 23 splits of one 32-pixel chunk (16-bit), 45 of 16 (float32): the final pass's whole trips of
# WG_PASS_SPLITS = 16 splits and a short last one
MANY_SPLITS = C("wg_many_splits", (2, 16, 20, 18), (24, 16, 3, 3), padding=((1, 1), (1, 1)))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_final_pass_of_many_splits_keeps_the_bits(monkeypatch, dtype):
    """conv_bwd_weight_igemm_finish reads 16 splits a trip without testing each against the last, then the rest with
    the tests: with more than 16 splits, not a multiple of 16, its bits are those of the finish in the kernel (two
    splits a trip) and of the separate pass, and grad_weight matches the float64 reference."""
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(MANY_SPLITS.x, numpy.float16),
                                               numpy.empty(MANY_SPLITS.weight), None, **MANY_SPLITS.kwargs)
    several_splits(monkeypatch, 1)
    splits = igemm.weight_igemm_plan(spec, DTYPES[dtype])[1].splits
    assert splits > 16 and splits % 16, splits
    test_a_long_last_read_keeps_the_final_pass(monkeypatch, MANY_SPLITS, dtype)


def test_which_shapes_finish_in_the_kernel():
    """The rule of `weight_igemm_plan`: r50-64's 3 x 3 layer (44 splits of 64 x 64: 704 KiB) finishes in the kernel,
    r50-128's 16-bit one (56 splits of 128 x 128: 3.5 MiB) keeps the final pass; one split always finishes."""
    def plan(n, c, hw, dtype):
        x = numpy.empty((n, c, hw, hw), dtype)
        spec = cupyconv.ops.conv.ConvSpec.for_conv("t", x, numpy.empty((c, c, 3, 3), dtype), None, stride=1,
                                                   padding=1, dilation=1, groups=1)
        return igemm.weight_igemm_plan(spec, dtype)
    several, r50_64, finish = plan(32, 64, 56, numpy.float16)
    assert not several and r50_64.tile == (64, 64) and r50_64.splits == 44 and finish
    _, r50_128, finish = plan(32, 128, 28, numpy.float16)
    assert r50_128.tile == (128, 128) and r50_128.splits * 128 * 128 * 4 > igemm.WG_FINISH_BYTES and not finish
    _, small, finish = plan(1, 64, 4, numpy.float16)
    assert small.splits == 1 and finish


# ResNet-50's 3x3 layers at batch 32 (benchmarks/cases.py r50-*): (channels, size, dtype) -> the grid `plan_weight_igemm`
# takes.  Each is at most the splits that bring the grid to about TC_SPLIT_BLOCKS blocks, and of those the count
# whose waves of the tile (PLAN_SMS x WG_BLOCKS_AN_SM) times chunks a split are fewest: r50-128's TF32 36 tiles
# in 14 splits (504 blocks, one wave of 4 an SM; 15 were 540: a second wave of 12 blocks), its 16-bit 9 tiles of
# 128 x 128 in 28 (252 blocks, one wave of 2 an SM; 56 were four).  Then (16-bit), of at most those splits, the
# count whose busiest SM runs the fewest chunks with 3 blocks or more (`busiest_sm_chunks`): r50-64's 9 tiles in
# 44 splits (396 blocks, 3 an SM of 72 chunks: 216; 56 put 4 of 56 on most SMs: 224).
WAVE_PLANS = {(64, 56, "float16"): (1, 9, 44), (64, 56, "float32"): (1, 9, 57), (128, 28, "float16"): (1, 9, 28),
              (128, 28, "float32"): (2, 18, 14), (256, 14, "float16"): (2, 18, 7), (256, 14, "float32"): (4, 36, 3),
              (512, 7, "float16"): (4, 36, 3), (512, 7, "float32"): (8, 72, 1)}


@pytest.mark.parametrize("shape", sorted(WAVE_PLANS), ids=str)
def test_splits_never_run_a_few_blocks_past_a_wave(shape):
    """`plan_weight_igemm` on ResNet-50's layers: the grids of WAVE_PLANS, within today's splits; no split count
    runs fewer chunks on its busiest SM (3 blocks or more) within the wave rule's splits (16-bit,
    `busiest_sm_chunks`)."""
    channels, size, dtype = shape
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty((32, channels, size, size), numpy.float16),
                                               numpy.empty((channels, channels, 3, 3)), None, stride=1, padding=1,
                                               dilation=1, groups=1)
    plan = igemm.plan_weight_igemm(spec, DTYPES[dtype])
    assert plan.grid == WAVE_PLANS[shape], plan
    tiles = plan.grid[0] * plan.grid[1]
    chunks = igemm.ceil_div(spec.n * spec.out_pixels, igemm.WG_CHUNK[dtype])
    most = _kernels.split_reduction(chunks, tiles, igemm.TC_SPLIT_BLOCKS, igemm.TC_SPLIT_CHUNKS,
                                    spec.out_channels * (spec.taps * spec.channels_per_group + 1) * 4)[0]
    assert plan.splits <= most and plan.chunks_per_split * plan.splits >= chunks > plan.chunks_per_split * (
        plan.splits - 1)
    wave = igemm.PLAN_SMS * igemm.WG_BLOCKS_AN_SM[igemm.WG_KIND[dtype], plan.tile]
    wave_splits = igemm.fewest_wave_chunks(chunks, tiles, wave, most)[0]
    if dtype == "float32":   # TF32 keeps the wave rule
        assert plan.splits == wave_splits
        return
    busiest = -(-tiles * plan.splits // igemm.PLAN_SMS) * plan.chunks_per_split
    assert plan.splits <= wave_splits
    for s in range(1, wave_splits + 1):   # (an independent count: SMs' blocks x chunks a split, 3 blocks or more)
        if -(-tiles * s // igemm.PLAN_SMS) >= 3:
            assert -(-tiles * s // igemm.PLAN_SMS) * -(-chunks // s) >= busiest, (s, plan)


def test_the_busiest_sm_keeps_three_blocks_and_a_tie_takes_more_splits():
    """`busiest_sm_chunks` (16-bit splits): 12 tiles of two blocks an SM over 1000 chunks keep the wave rule's 22
    splits (264 blocks, 2 x 46 chunks on the busiest SM) although 11 (one block of 91 chunks an SM) would run fewer
    there: one block an SM is latency-bound.  9 tiles over 1013 chunks: 57 splits (4 blocks of 18 on the busiest
    SM) and 43 (3 of 24) tie at 72 chunks; the more splits win (more blocks to hide latency)."""
    assert igemm.fewest_wave_chunks(1000, 12, 264, 22)[0] == 22
    assert igemm.busiest_sm_chunks(1000, 12, 264, 22) == (22, 46)
    assert igemm.busiest_sm_chunks(1013, 9, 528, 60) == (57, 18)
