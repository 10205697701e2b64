"""Bad input: every op raises ValueError or TypeError, and the message names the op, the argument and (where
there are shapes) the shapes.  The problems are declared as a table; each row is one bad call."""
import re

import numpy
import pytest

import cupyconv as cc

rng = numpy.random.default_rng(0)
X = rng.standard_normal((2, 4, 5, 6))                 # (N, C, H, W)
W = rng.standard_normal((6, 2, 3, 3))                 # groups=2 weight
W1 = rng.standard_normal((6, 4, 3, 3))                # groups=1 weight
B = rng.standard_normal(6)
GY = rng.standard_normal((2, 6, 3, 4))                # conv2d(X, W, groups=2) output
DW = rng.standard_normal((8, 1, 3, 3))                # depthwise, multiplier 2
DGY = rng.standard_normal((2, 8, 3, 4))
P = rng.standard_normal((2, 3, 4, 5, 6))              # patches (B, N, C, H, W)
PGY = rng.standard_normal((2, 3, 6, 3, 4))
COLS = rng.standard_normal((2, 4 * 4, 12))            # unfold(X, 2): (N, C * 2 * 2, 4 * 3) for a 5x4 plane
X5x4 = rng.standard_normal((2, 4, 5, 4))


def s(shape) -> str:
    """A shape as the messages print it, escaped for a regex."""
    return re.escape(str(tuple(shape)))


def bad(call, error, pattern, id):
    return pytest.param(call, error, pattern, id=id)


DTYPE_LIST = re.escape("float16, bfloat16, float32, float64")

BAD_INPUT = [
    # wrong number of dimensions
    bad(lambda: cc.conv2d(X[0], W, groups=2), ValueError, rf"^conv2d: x must have 4 dimensions.*{s(X[0].shape)}",
        "conv2d-x-3d"),
    bad(lambda: cc.conv2d(P, W, groups=2), ValueError, rf"^conv2d: x must have 4 dimensions.*{s(P.shape)}",
        "conv2d-x-5d"),
    bad(lambda: cc.conv2d(X, W[0], groups=2), ValueError, rf"^conv2d: weight must have 4 dimensions.*{s(W[0].shape)}",
        "conv2d-weight-3d"),
    bad(lambda: cc.conv2d_backward(GY, X, W[None], groups=2), ValueError,
        rf"^conv2d_backward: weight must have 4 dimensions.*{s((1, *W.shape))}", "conv2d_backward-weight-5d"),
    bad(lambda: cc.depthwise_conv2d(X[0], DW), ValueError,
        rf"^depthwise_conv2d: x must have 4 dimensions.*{s(X[0].shape)}", "depthwise-x-3d"),
    bad(lambda: cc.patch_conv2d(X[0, 0], W1), ValueError,
        rf"^patch_conv2d: x must have at least 3 dimensions.*{s(X[0, 0].shape)}", "patch-x-2d"),
    bad(lambda: cc.patch_conv2d(P, W1[..., 0]), ValueError,
        rf"^patch_conv2d: weight must have 4 dimensions.*{s(W1[..., 0].shape)}", "patch-weight-3d"),
    bad(lambda: cc.unfold(X[0, 0], 2), ValueError, rf"^unfold: x must have at least 3 dimensions.*{s((5, 6))}",
        "unfold-x-2d"),
    bad(lambda: cc.fold(COLS[0, 0], (5, 4), 2), ValueError,
        rf"^fold: cols must have at least 2 dimensions.*{s((12,))}", "fold-cols-1d"),
    bad(lambda: cc.unfold_backward(COLS[0, 0], (5, 4), 2), ValueError,
        rf"^unfold_backward: grad_output must have at least 2 dimensions.*{s((12,))}", "unfold_backward-1d"),
    bad(lambda: cc.fold_backward(X[0, 0], 2), ValueError,
        rf"^fold_backward: grad_output must have at least 3 dimensions.*{s((5, 6))}", "fold_backward-2d"),

    # channels and groups
    bad(lambda: cc.conv2d(X, W), ValueError,
        rf"^conv2d: weight {s(W.shape)} has 2 input channels per group but x {s(X.shape)} has 4 channels "
        rf"with groups=1", "conv2d-channel-mismatch"),
    bad(lambda: cc.conv2d_backward(GY, X, W, groups=1), ValueError,
        rf"^conv2d_backward: weight {s(W.shape)} has 2 input channels per group but x {s(X.shape)}",
        "conv2d_backward-channel-mismatch"),
    bad(lambda: cc.patch_conv2d(P, W1, groups=2), ValueError,
        rf"^patch_conv2d: weight {s(W1.shape)} has 4 input channels per group but x {s(P.shape)} has 4 "
        rf"channels with groups=2", "patch-channel-mismatch"),
    bad(lambda: cc.conv2d(X, W, groups=3), ValueError,
        rf"^conv2d: groups=3 does not divide the 4 input channels of x {s(X.shape)}", "groups-not-dividing-C"),
    bad(lambda: cc.conv2d(X, W[:5], groups=2), ValueError,
        rf"^conv2d: groups=2 does not divide the 5 output channels of weight {s(W[:5].shape)}",
        "groups-not-dividing-D"),
    bad(lambda: cc.patch_conv2d_backward(PGY, P, W[:5], groups=2), ValueError,
        rf"^patch_conv2d_backward: groups=2 does not divide the 5 output channels of weight {s(W[:5].shape)}",
        "patch_backward-groups-not-dividing-D"),
    bad(lambda: cc.conv2d(X, W, groups=0), ValueError, r"^conv2d: groups must be a positive int, got 0",
        "groups-zero"),
    bad(lambda: cc.conv2d(X, W, groups=-2), ValueError, r"^conv2d: groups must be a positive int, got -2",
        "groups-negative"),
    bad(lambda: cc.conv2d(X, W, groups=2.0), TypeError, r"^conv2d: groups must be an int, got 2\.0",
        "groups-float"),
    bad(lambda: cc.conv2d(X, W1, groups=True), TypeError, r"^conv2d: groups must be an int, got True",
        "groups-bool"),
    bad(lambda: cc.patch_conv2d(P, W, groups="2"), TypeError, r"^patch_conv2d: groups must be an int, got '2'",
        "groups-str"),
    bad(lambda: cc.conv2d_backward(GY, X, W, groups=None), TypeError,
        r"^conv2d_backward: groups must be an int, got None", "groups-none"),

    # depthwise weight
    bad(lambda: cc.depthwise_conv2d(X, W), ValueError,
        rf"^depthwise_conv2d: weight must have shape \(C \* m, 1, kH, kW\) with C = 4 channels of x {s(X.shape)}"
        rf".*got {s(W.shape)}", "depthwise-weight-not-1-channel"),
    bad(lambda: cc.depthwise_conv2d(X, DW[:6]), ValueError,
        rf"^depthwise_conv2d: weight must have shape \(C \* m, 1, kH, kW\).*{s(X.shape)}.*got {s(DW[:6].shape)}",
        "depthwise-weight-not-multiple-of-C"),
    bad(lambda: cc.depthwise_conv2d(X, DW[:, 0]), ValueError,
        rf"^depthwise_conv2d: weight must have shape \(C \* m, 1, kH, kW\).*got {s(DW[:, 0].shape)}",
        "depthwise-weight-3d"),
    bad(lambda: cc.depthwise_conv2d_backward(DGY, X, DW[:0]), ValueError,
        rf"^depthwise_conv2d_backward: weight must have shape \(C \* m, 1, kH, kW\).*got {s(DW[:0].shape)}",
        "depthwise_backward-weight-empty"),
    # C = 0: one group per channel, none at all (torch refuses groups = 0 too); not a complaint about `groups`
    bad(lambda: cc.depthwise_conv2d(X[:, :0], DW[:0]), ValueError,
        rf"^depthwise_conv2d: x {s((2, 0, 5, 6))} has 0 channels; a depthwise convolution .* needs at least 1",
        "depthwise-no-channels"),
    bad(lambda: cc.depthwise_conv2d(X[:, :0], DW), ValueError,
        rf"^depthwise_conv2d: x {s((2, 0, 5, 6))} has 0 channels", "depthwise-no-channels-with-filters"),
    bad(lambda: cc.depthwise_conv1d_backward(DGY[..., 0], X[:, :0, :, 0], DW[..., 0]), ValueError,
        rf"^depthwise_conv1d_backward: x {s((2, 0, 5))} has 0 channels", "depthwise1d_backward-no-channels"),

    # stride, dilation, kernel_size
    bad(lambda: cc.conv2d(X, W, stride=0, groups=2), ValueError, r"^conv2d: stride must be >= 1.*got 0",
        "stride-zero"),
    bad(lambda: cc.conv2d(X, W, stride=(1, -1), groups=2), ValueError,
        r"^conv2d: stride must be >= 1.*got \(1, -1\)", "stride-negative"),
    bad(lambda: cc.conv2d(X, W, stride=True, groups=2), TypeError,
        r"^conv2d: stride must be an int or a pair of ints, got True", "stride-bool"),
    bad(lambda: cc.depthwise_conv2d(X, DW, stride=1.5), TypeError,
        r"^depthwise_conv2d: stride must be an int or a pair of ints, got 1\.5", "stride-float"),
    bad(lambda: cc.unfold(X, 2, stride=(1, 2, 3)), TypeError,
        r"^unfold: stride must be an int or a pair of ints, got \(1, 2, 3\)", "stride-triple"),
    bad(lambda: cc.fold(COLS, (5, 4), 2, stride=0), ValueError, r"^fold: stride must be >= 1.*got 0",
        "fold-stride-zero"),
    bad(lambda: cc.conv2d(X, W, dilation=0, groups=2), ValueError, r"^conv2d: dilation must be >= 1.*got 0",
        "dilation-zero"),
    bad(lambda: cc.patch_conv2d(P, W1, dilation=(-1, 1)), ValueError,
        r"^patch_conv2d: dilation must be >= 1.*got \(-1, 1\)", "dilation-negative"),
    bad(lambda: cc.conv2d_backward(GY, X, W, dilation=(2, False), groups=2), TypeError,
        r"^conv2d_backward: dilation must be an int or a pair of ints, got \(2, False\)", "dilation-bool"),
    bad(lambda: cc.unfold(X, 2, dilation=1.0), TypeError, r"^unfold: dilation must be an int or a pair of ints",
        "dilation-float"),
    bad(lambda: cc.unfold(X, 0), ValueError, r"^unfold: kernel_size must be >= 1.*got 0", "kernel-zero"),
    bad(lambda: cc.fold(COLS, (5, 4), (2, 2.0)), TypeError,
        r"^fold: kernel_size must be an int or a pair of ints, got \(2, 2\.0\)", "kernel-float"),

    # padding
    bad(lambda: cc.conv2d(X, W, padding=-1, groups=2), ValueError, r"^conv2d: padding must be >= 0.*got -1",
        "padding-negative"),
    bad(lambda: cc.depthwise_conv2d(X, DW, padding=(1, -2)), ValueError,
        r"^depthwise_conv2d: padding must be >= 0.*got \(1, -2\)", "padding-negative-pair"),
    bad(lambda: cc.unfold(X, 2, padding=((0, -1), (0, 0))), ValueError,
        r"^unfold: padding must be >= 0.*got \(\(0, -1\), \(0, 0\)\)", "padding-negative-side"),
    bad(lambda: cc.conv2d(X, W, padding="full", groups=2), ValueError,
        r"^conv2d: padding must be an int, a pair, \(\(top, bottom\), \(left, right\)\), 'same' or 'valid', "
        r"got 'full'", "padding-string-full"),
    bad(lambda: cc.fold(COLS, (5, 4), 2, padding=""), ValueError, r"^fold: padding must be .*'same' or 'valid', got ''",
        "padding-string-empty"),
    bad(lambda: cc.patch_conv2d(P, W1, padding="causal"), ValueError,
        r"^patch_conv2d: padding must be .* got 'causal'", "padding-string-causal"),
    # torch spells the padding strings in lower case only and refuses 'SAME' and 'Same': so do we
    bad(lambda: cc.conv2d(X, W, padding="SAME", groups=2), ValueError,
        r"^conv2d: padding strings are 'same' and 'valid' in lower case, as torch spells them, got 'SAME'",
        "padding-string-upper"),
    bad(lambda: cc.conv1d(X[:, :, 0], W[:, :, 0], padding="Valid", groups=2), ValueError,
        r"^conv1d: padding strings are 'same' and 'valid' .* got 'Valid'", "padding-string-capitalised"),
    bad(lambda: cc.conv_transpose2d(X, W1.transpose(1, 0, 2, 3), padding="Same"), ValueError,
        r"^conv_transpose2d: padding strings are 'same' and 'valid' .* got 'Same'", "padding-string-transpose"),
    bad(lambda: cc.conv2d(X, W, padding=(1, 2, 3), groups=2), TypeError,
        r"^conv2d: padding must be an int, a pair, .* got \(1, 2, 3\)", "padding-triple"),
    bad(lambda: cc.conv2d(X, W, padding=((1, 2), 3), groups=2), TypeError,
        r"^conv2d: padding must be .* got \(\(1, 2\), 3\)", "padding-mixed"),
    bad(lambda: cc.unfold(X, 2, padding=1.5), TypeError, r"^unfold: padding must be .* got 1\.5", "padding-float"),

    # empty output
    bad(lambda: cc.conv2d(X, rng.standard_normal((6, 2, 6, 3)), groups=2), ValueError,
        r"^conv2d: output size would be 0x4 \(input 5x6, kernel 6x3.*it must be at least 1x1",
        "conv2d-kernel-larger-than-input"),
    bad(lambda: cc.depthwise_conv2d(X, DW, dilation=3), ValueError,
        r"^depthwise_conv2d: output size would be -1x0 \(input 5x6, kernel 3x3.*dilation \(3, 3\)",
        "depthwise-dilation-too-large"),
    bad(lambda: cc.patch_conv2d(P[..., :1, :1], W1, padding=(0, 1)), ValueError,
        r"^patch_conv2d: output size would be -1x1 \(input 1x1, kernel 3x3", "patch-empty-output"),
    bad(lambda: cc.unfold(X, 7), ValueError, r"^unfold: output size would be -1x0 \(input 5x6, kernel 7x7",
        "unfold-kernel-too-large"),
    bad(lambda: cc.fold(COLS, (1, 1), 2), ValueError, r"^fold: output size would be 0x0 \(input 1x1, kernel 2x2",
        "fold-output-smaller-than-kernel"),

    # bias
    bad(lambda: cc.conv2d(X, W, B[:5], groups=2), ValueError,
        rf"^conv2d: bias must have shape \(6,\) to match weight {s(W.shape)}, got {s((5,))}", "bias-short"),
    bad(lambda: cc.patch_conv2d(P, W1, B[:, None]), ValueError,
        rf"^patch_conv2d: bias must have shape \(6,\) to match weight {s(W1.shape)}, got {s((6, 1))}",
        "bias-2d"),
    bad(lambda: cc.depthwise_conv2d(X, DW, B), ValueError,
        rf"^depthwise_conv2d: bias must have shape \(8,\) to match weight {s(DW.shape)}, got {s((6,))}",
        "depthwise-bias"),
    bad(lambda: cc.conv2d(X, W1, numpy.float64(1.0)), TypeError,
        r"^conv2d: bias must be a numpy\.ndarray, cupy\.ndarray or torch\.Tensor, got a numpy\.float64",
        "bias-scalar"),

    # grad_output of every backward
    bad(lambda: cc.conv2d_backward(GY[:, :, :2], X, W, groups=2), ValueError,
        rf"^conv2d_backward: grad_output has shape {s((2, 6, 2, 4))} but the forward output of x {s(X.shape)} "
        rf"and weight {s(W.shape)} has shape {s(GY.shape)}", "conv2d_backward-grad_output"),
    bad(lambda: cc.depthwise_conv2d_backward(GY, X, DW), ValueError,
        rf"^depthwise_conv2d_backward: grad_output has shape {s(GY.shape)} but the forward output of x "
        rf"{s(X.shape)} and weight {s(DW.shape)} has shape {s(DGY.shape)}", "depthwise_backward-grad_output"),
    bad(lambda: cc.patch_conv2d_backward(PGY[:1], P, W, groups=2), ValueError,
        rf"^patch_conv2d_backward: grad_output has shape {s(PGY[:1].shape)} but the forward output of x "
        rf"{s(P.shape)} and weight {s(W.shape)} has shape {s(PGY.shape)}", "patch_backward-grad_output"),
    bad(lambda: cc.unfold_backward(COLS[..., :11], (5, 4), 2), ValueError,
        rf"^unfold_backward: grad_output {s((2, 16, 11))} has 11 blocks but input_size \(5, 4\).* gives "
        rf"4x3 = 12 blocks", "unfold_backward-grad_output-blocks"),
    bad(lambda: cc.unfold_backward(COLS[:, :15], (5, 4), 2), ValueError,
        rf"^unfold_backward: grad_output {s((2, 15, 12))} has 15 rows, not a multiple of kernel_size 2x2 = 4",
        "unfold_backward-grad_output-rows"),

    # needs
    bad(lambda: cc.conv2d_backward(GY, X, W, groups=2, needs=("input", "grad")), ValueError,
        r"^conv2d_backward: needs may contain only \('input', 'weight', 'bias'\), got \['grad'\]",
        "conv2d_backward-needs"),
    bad(lambda: cc.depthwise_conv2d_backward(DGY, X, DW, needs="inputs"), ValueError,
        r"^depthwise_conv2d_backward: needs may contain only .*got \['inputs'\]", "depthwise_backward-needs"),
    bad(lambda: cc.patch_conv2d_backward(PGY, P, W, groups=2, needs=(5, "x")), ValueError,
        r"^patch_conv2d_backward: needs may contain only .*got \['x', 5\]", "patch_backward-needs"),
    # None could mean every gradient (the default) or none: refused, with the accepted forms
    bad(lambda: cc.conv2d_backward(GY, X, W, groups=2, needs=None), TypeError,
        r"^conv2d_backward: needs must be a name from \('input', 'weight', 'bias'\) or an iterable of them, e\.g\. "
        r"needs=\('input', 'weight', 'bias'\) \(the default, every gradient\), needs=\('input',\) or "
        r"needs='weight', got None", "conv2d_backward-needs-none"),
    bad(lambda: cc.conv_transpose2d_backward(X, GY, W, groups=2, needs=None), TypeError,
        r"^conv_transpose2d_backward: needs must be a name from .* got None", "transpose_backward-needs-none"),
    bad(lambda: cc.depthwise_conv3d_backward(DGY[..., None], X[..., None], DW[..., None], needs=1), TypeError,
        r"^depthwise_conv3d_backward: needs must be a name from .* got 1", "depthwise3d_backward-needs-int"),
    bad(lambda: cc.patch_conv2d_backward(PGY, P, W, groups=2, needs=("input", ["weight"])), TypeError,
        r"^patch_conv2d_backward: needs must be a name from .* got \('input', \['weight'\]\)",
        "patch_backward-needs-unhashable"),

    # fold: cols against output_size
    bad(lambda: cc.fold(COLS[..., :11], (5, 4), 2), ValueError,
        rf"^fold: cols {s((2, 16, 11))} has 11 blocks but output_size \(5, 4\) with kernel_size \(2, 2\).* "
        rf"gives 4x3 = 12 blocks", "fold-wrong-L"),
    bad(lambda: cc.fold(COLS, (5, 5), 2), ValueError,
        rf"^fold: cols {s(COLS.shape)} has 12 blocks but output_size \(5, 5\).*gives 4x4 = 16 blocks",
        "fold-wrong-output_size"),
    bad(lambda: cc.fold(COLS[:, :14], (5, 4), 2), ValueError,
        rf"^fold: cols {s((2, 14, 12))} has 14 rows, not a multiple of kernel_size 2x2 = 4", "fold-rows"),
    bad(lambda: cc.fold(COLS, (0, 4), 2), ValueError, r"^fold: output size would be -1x3 \(input 0x4, kernel 2x2",
        "fold-output_size-zero"),
    bad(lambda: cc.fold(COLS, (-1, 4), 2), ValueError, r"^fold: output_size must be >= 0.*got \(-1, 4\)",
        "fold-output_size-negative"),
    bad(lambda: cc.fold(COLS, (5.0, 4), 2), TypeError, r"^fold: output_size must be an int or a pair of ints",
        "fold-output_size-float"),

    # dtypes and array kinds
    bad(lambda: cc.conv2d(X.astype(numpy.float32), W, groups=2), TypeError,
        r"^conv2d: x has dtype float32 but weight has dtype float64; all arrays of one call must have one dtype",
        "mixed-dtypes"),
    bad(lambda: cc.conv2d(X, W, B.astype(numpy.float16), groups=2), TypeError,
        r"^conv2d: x has dtype float64 but bias has dtype float16", "mixed-dtypes-bias"),
    bad(lambda: cc.conv2d_backward(GY.astype(numpy.float32), X, W, groups=2), TypeError,
        r"^conv2d_backward: grad_output has dtype float32 but x has dtype float64", "mixed-dtypes-grad"),
    bad(lambda: cc.conv2d(X.astype(numpy.int64), W.astype(numpy.int64), groups=2), TypeError,
        rf"^conv2d: x has dtype int64; supported dtypes are {DTYPE_LIST}", "int64"),
    bad(lambda: cc.depthwise_conv2d(X.astype(numpy.complex64), DW.astype(numpy.complex64)), TypeError,
        rf"^depthwise_conv2d: x has dtype complex64; supported dtypes are {DTYPE_LIST}", "complex64"),
    bad(lambda: cc.unfold(X > 0, 2), TypeError, rf"^unfold: x has dtype bool; supported dtypes are {DTYPE_LIST}",
        "bool"),
    bad(lambda: cc.fold(COLS.astype(numpy.int32), (5, 4), 2), TypeError, r"^fold: cols has dtype int32; supported",
        "fold-int32"),
    bad(lambda: cc.patch_conv2d(P, W1.astype(numpy.uint8)), TypeError,
        r"^patch_conv2d: weight has dtype uint8; supported", "uint8-weight"),
    bad(lambda: cc.conv2d(X.tolist(), W, groups=2), TypeError,
        r"^conv2d: x must be a numpy\.ndarray, cupy\.ndarray or torch\.Tensor, got a builtins\.list", "x-list"),
    bad(lambda: cc.conv2d(X, None), TypeError, r"^conv2d: weight must be a numpy\.ndarray.*got None",
        "weight-none"),
    bad(lambda: cc.unfold(None, 2), TypeError, r"^unfold: x must be a numpy\.ndarray.*got None", "x-none"),
    # per-call workspace budgets: checked and named by the op, like the transposed ops and cupyconv.torch do
    bad(lambda: cc.conv2d(X, W, groups=2, workspace_limit=1.5), TypeError,
        r"^conv2d: workspace_limit must be None or an int number of bytes, got 1\.5", "workspace-float"),
    bad(lambda: cc.conv2d_backward(GY, X, W, groups=2, workspace_limit=0), ValueError,
        r"^conv2d_backward: workspace_limit must be a positive number of bytes, got 0", "workspace-zero"),
    bad(lambda: cc.conv3d(X[:, :, None], W[:, :, None], groups=2, workspace_limit=True), TypeError,
        r"^conv3d: workspace_limit must be None or an int", "workspace-bool"),
    bad(lambda: cc.conv2d(X, W, groups=2, workspace_limit=numpy.True_), TypeError,
        r"^conv2d: workspace_limit must be None or an int", "workspace-numpy-bool"),
    # bools are not ints anywhere ints are taken (NumPy's included)
    bad(lambda: cc.conv2d(X, W, groups=numpy.True_), TypeError, r"^conv2d: groups must be an int, got np\.True_",
        "groups-numpy-bool"),
    bad(lambda: cc.conv2d(X, W, groups=2, stride=(True, 1)), TypeError, r"^conv2d: stride must be an int or a pair",
        "stride-bool"),
    bad(lambda: cc.conv2d(X, W, groups=2, padding=((True, 0), (0, 0))), TypeError, r"^conv2d: padding must be",
        "padding-bool"),
    bad(lambda: cc.unfold(X, (2, True)), TypeError, r"^unfold: kernel_size must be an int or a pair", "kernel-bool"),
]


@pytest.mark.parametrize("call, error, pattern", BAD_INPUT)
def test_bad_input_raises_with_a_message_naming_the_argument(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_good_calls_from_the_table_pass():
    """The fixtures of the table are valid themselves, so each row fails for the one reason it names."""
    assert cc.conv2d(X, W, B, groups=2).shape == GY.shape
    assert cc.depthwise_conv2d(X, DW).shape == DGY.shape
    assert cc.patch_conv2d(P, W, B, groups=2).shape == PGY.shape
    assert cc.unfold(X5x4, 2).shape == COLS.shape
    assert cc.fold(COLS, (5, 4), 2).shape == X5x4.shape
    assert all(g is not None for g in cc.conv2d_backward(GY, X, W, groups=2))
    assert all(g is not None for g in cc.depthwise_conv2d_backward(DGY, X, DW))
    assert all(g is not None for g in cc.patch_conv2d_backward(PGY, P, W, groups=2))
    assert cc.unfold_backward(COLS, (5, 4), 2).shape == X5x4.shape


def test_mixed_dtypes_through_torch():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(X).to(torch.bfloat16)
    w = torch.from_numpy(W).float()
    with pytest.raises(TypeError, match=r"^conv2d: x has dtype bfloat16 but weight has dtype float32"):
        cc.conv2d(x, w, groups=2)
    with pytest.raises(TypeError, match=r"^unfold: x has dtype int32; supported"):
        cc.unfold(torch.zeros((1, 2, 3, 3), dtype=torch.int32), 2)
    with pytest.raises(TypeError, match=r"^unfold: x has dtype complex64; supported"):
        cc.unfold(torch.zeros((1, 2, 3, 3), dtype=torch.complex64), 2)


def test_numpy_ints_are_taken_wherever_ints_are():
    """workspace_limit as stride, padding and groups: a NumPy int is an int (and the setting takes one too)."""
    i64 = numpy.int64
    want = cc.conv2d(X, W, groups=2, stride=2, padding=1)
    got = cc.conv2d(X, W, groups=i64(2), stride=i64(2), padding=i64(1), workspace_limit=i64(4096))
    numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)   # chunked differently: sums in another order
    with cc.settings.workspace_limit(numpy.int32(4096)):
        assert cc.settings.get_workspace_limit() == 4096 and type(cc.settings.get_workspace_limit()) is int


def test_fold_and_unfold_backward_return_contiguous_arrays():
    """The CPU fold sums into a padded buffer: the result must be a new contiguous array, not a view into it."""
    cols = cc.unfold(X5x4, 2, padding=1)
    for result in (cc.fold(cols, (5, 4), 2, padding=1), cc.unfold_backward(cols, (5, 4), 2, padding=1),
                   cc.fold(cols.astype(numpy.float16), (5, 4), 2, padding=1)):
        assert result.flags.c_contiguous and result.shape == X5x4.shape


def test_ndarray_subclasses_compute_as_plain_arrays():
    """numpy.matrix stays 2-D under reshape: it is computed on as its ndarray view, the result an ndarray."""
    plain = rng.standard_normal((3, 4))
    got = cc.unfold(numpy.asmatrix(plain), (2,))
    assert type(got) is numpy.ndarray
    numpy.testing.assert_array_equal(got, cc.unfold(plain, (2,)))
    numpy.testing.assert_array_equal(cc.conv1d(numpy.asmatrix(plain)[None].A, W1[:3, :3, 0]),
                                     cc.conv1d(plain[None], W1[:3, :3, 0]))


# ---------------------------------------------------------------------------------------------------------
# Huge but valid geometry: answered (it reads the same positions as a small one), or the documented error
# before NumPy or a kernel's argument packing fails

from cupyconv import _device  # noqa: E402
from emulator import EmulatedDevice  # noqa: E402

HUGE = 2**62


def _torch_f():
    return pytest.importorskip("torch").nn.functional


def _t(a):
    import torch
    return torch.from_numpy(numpy.ascontiguousarray(a, dtype=numpy.float64))


def _one_window_cases():
    """(id, the call with a huge stride/dilation/padding, the same problem with small ones by torch)."""
    x1, w1 = rng.standard_normal((2, 2, 5)), rng.standard_normal((3, 2, 2))
    x2, w2 = rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((3, 2, 2, 2))
    x3, w3 = rng.standard_normal((1, 2, 3, 4, 4)), rng.standard_normal((2, 2, 2, 2, 2))
    dw3 = rng.standard_normal((4, 1, 2, 2, 2))
    p2 = rng.standard_normal((2, 3, 2, 4, 4))
    gy1 = rng.standard_normal((2, 3, 1))
    F = _torch_f()

    def torch_grads(gy, x, w, **kw):
        tx, tw = _t(x).requires_grad_(), _t(w).requires_grad_()
        F.conv1d(tx, tw, **kw).backward(_t(gy))
        return tx.grad.numpy(), tw.grad.numpy()

    return [
        ("conv1d-stride", lambda: cc.conv1d(x1, w1, stride=HUGE), lambda: F.conv1d(_t(x1), _t(w1), stride=5)),
        ("conv_nd-stride-2^70", lambda: cc.conv_nd(x1, w1, stride=2**70), lambda: F.conv1d(_t(x1), _t(w1), stride=5)),
        ("conv1d-high-padding", lambda: cc.conv1d(x1, w1, padding=((1, 2**40),), stride=2**41),
         lambda: F.conv1d(F.pad(_t(x1), (1, 0)), _t(w1), stride=9)),
        ("conv1d-dilation-one-tap", lambda: cc.conv1d(x1, w1[..., :1], dilation=2**40),
         lambda: F.conv1d(_t(x1), _t(w1[..., :1]))),
        ("conv2d-stride", lambda: cc.conv2d(x2, w2, stride=(HUGE, 2)), lambda: F.conv2d(_t(x2), _t(w2), stride=(5, 2))),
        ("conv3d-stride", lambda: cc.conv3d(x3, w3, stride=HUGE), lambda: F.conv3d(_t(x3), _t(w3), stride=4)),
        ("depthwise_conv3d-stride", lambda: cc.depthwise_conv3d(x3, dw3, stride=HUGE),
         lambda: F.conv3d(_t(x3), _t(dw3), stride=4, groups=2)),
        ("patch_conv2d-stride", lambda: cc.patch_conv2d(p2, w2, stride=HUGE),
         lambda: F.conv2d(_t(p2.reshape(6, 2, 4, 4)), _t(w2), stride=4).reshape(2, 3, 3, 1, 1)),
        ("patch_conv1d-stride", lambda: cc.patch_conv1d(x1[None], w1, stride=HUGE),
         lambda: F.conv1d(_t(x1), _t(w1), stride=5)[None]),
        ("patch_conv3d-stride", lambda: cc.patch_conv3d(x3[None], w3, stride=HUGE),
         lambda: F.conv3d(_t(x3), _t(w3), stride=4)[None]),
        ("unfold-stride", lambda: cc.unfold(x2, (2, 3), stride=HUGE), lambda: F.unfold(_t(x2), (2, 3), stride=6)),
        ("fold_backward-stride", lambda: cc.fold_backward(x2, (2, 3), stride=HUGE),
         lambda: F.unfold(_t(x2), (2, 3), stride=6)),
        ("conv1d_backward-stride", lambda: cc.conv1d_backward(gy1, x1, w1, stride=HUGE, needs=("input", "weight")),
         lambda: torch_grads(gy1, x1, w1, stride=5)),
        ("conv_transpose1d-stride", lambda: cc.conv_transpose1d(x1[..., :1], w1.swapaxes(0, 1), stride=HUGE),
         lambda: F.conv_transpose1d(_t(x1[..., :1]), _t(w1.swapaxes(0, 1)))),
    ]


@pytest.mark.parametrize("device", [None, EmulatedDevice()], ids=["cpu", "emulated"])
def test_huge_valid_geometry_is_answered(device):
    for name, call, reference in _one_window_cases():
        with _device.use_device(device) if device is not None else _nullcontext():
            got = call()
        want = reference()
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, r in zip((g for g in got if g is not None), want):
            numpy.testing.assert_allclose(g, numpy.asarray(r), rtol=1e-10, atol=1e-12, err_msg=name)


def _nullcontext():
    import contextlib
    return contextlib.nullcontext()


ONE4 = numpy.ones((1, 1, 4))
HUGE_REFUSED = [
    # outputs of 2^63 elements and more: the documented MemoryError, before the placeholder output is made
    ("conv_transpose1d", lambda: cc.conv_transpose1d(ONE4, ONE4[..., :2], stride=HUGE), MemoryError),
    ("conv_transpose2d", lambda: cc.conv_transpose2d(ONE4[..., :2, None] * ONE4[..., None, :2],
                                                     numpy.ones((1, 1, 2, 2)), dilation=2**40), MemoryError),
    ("conv_transpose3d", lambda: cc.conv_transpose3d(numpy.ones((1, 1, 2, 1, 1)), numpy.ones((1, 1, 1, 1, 1)),
                                                     stride=HUGE), MemoryError),
]


@pytest.mark.parametrize("device", [None, EmulatedDevice()], ids=["cpu", "emulated"])
@pytest.mark.parametrize("op, call, error", HUGE_REFUSED, ids=[c[0] for c in HUGE_REFUSED])
def test_huge_impossible_geometry_raises_the_documented_error(op, call, error, device):
    with _device.use_device(device) if device is not None else _nullcontext():
        with pytest.raises(error, match=rf"^{op}: float64 arrays need \d+ bytes"):
            call()


def test_a_window_past_32_bits_is_a_clear_error_on_the_gpu_path():
    """One output pixel whose window reaches 2^40 positions into the padding: the CPU path would need that padded
    copy (MemoryError), the kernels cannot index it (ValueError naming the op), neither fails inside NumPy or the
    argument packing."""
    args = dict(padding=2**40, dilation=2**40, stride=2**41)
    with pytest.raises(MemoryError, match=r"^conv1d: float64 arrays need \d+ bytes: .*padded copy"):
        cc.conv1d(ONE4, ONE4[..., :2], **args)
    with _device.use_device(EmulatedDevice()):
        with pytest.raises(ValueError, match=r"^conv1d: the padded input spans 1099511627780 positions along "
                                             r"spatial dim 0 .* at most 2147483647 positions"):
            cc.conv1d(ONE4, ONE4[..., :2], **args)
