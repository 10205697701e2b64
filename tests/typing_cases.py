"""The public API called as a user's type-checked code calls it: mypy checks this file, nothing runs it.

`assert_type` fails the check when an annotation changes what a caller gets back.  A call the annotations must
refuse carries ``# type: ignore[<code>]``; with warn_unused_ignores (pyproject.toml) that comment becomes an error
the day the annotations accept the call.  CI: `python -m mypy` in .ci/run.
"""
import numpy
import numpy.typing
from typing_extensions import assert_type

import cupyconv
from cupyconv import cudnn, settings

Array = numpy.typing.NDArray[numpy.float32]
Grads = tuple[Array | None, Array | None, Array | None]

x: Array = numpy.zeros((2, 4, 8, 8), numpy.float32)
w: Array = numpy.zeros((6, 2, 3, 3), numpy.float32)
b: Array = numpy.zeros(6, numpy.float32)
y: Array = numpy.zeros((2, 6, 8, 8), numpy.float32)


def forward_ops_return_the_callers_array_kind() -> None:
    assert_type(cupyconv.conv2d(x, w, b, stride=1, padding="same", groups=2, algorithm="direct"), Array)
    assert_type(cupyconv.conv1d(x[:, :, 0], w[..., 0], None, 2, 1), Array)
    assert_type(cupyconv.conv3d(x[:, :, None], w[:, :, None], padding=((0, 0), (1, 1), (1, 1))), Array)
    assert_type(cupyconv.conv_nd(x, w, workspace_limit=2**20), Array)
    assert_type(cupyconv.depthwise_conv2d(x, w[:4, :1], stride=(1, 2), dilation=[1, 2]), Array)
    assert_type(cupyconv.patch_conv2d(x[None], w, padding="valid"), Array)
    assert_type(cupyconv.conv_transpose2d(y, w, output_padding=0, groups=2), Array)
    assert_type(cupyconv.unfold(x, 3, padding=1), Array)
    assert_type(cupyconv.fold(cupyconv.unfold(x, 3, padding=1), (8, 8), 3, padding=1), Array)


def backward_ops_return_three_optional_gradients() -> None:
    assert_type(cupyconv.conv2d_backward(y, x, w, padding=1, groups=2), Grads)
    assert_type(cupyconv.conv_nd_backward(y, x, w, padding=1, groups=2, needs="weight"), Grads)
    assert_type(cupyconv.depthwise_conv3d_backward(y, x, w, needs=("input", "bias")), Grads)
    assert_type(cupyconv.conv_transpose_nd_backward(x, y, w, groups=2, needs=["weight"]), Grads)
    assert_type(cupyconv.unfold_backward(cupyconv.unfold(x, 3), (8, 8), 3), Array)


def settings_have_typed_getters_setters_and_scopes() -> None:
    assert_type(cupyconv.get_allow_tf32(), bool)
    assert_type(settings.get_workspace_limit(), int)
    cupyconv.set_autotune(True)
    with settings.deterministic(True), cupyconv.workspace_limit(2**20):
        pass
    cudnn.set_max_workspace_size(2**22)
    assert_type(cudnn.get_max_workspace_size(), int)
    cudnn.convolution_forward(x, w, b, y, (1, 1), (1, 1), None, 2, auto_tune=True, d_layout=cudnn.CUDNN_TENSOR_NHWC)


def the_annotations_refuse_what_the_functions_refuse() -> None:
    cupyconv.conv2d([[1.0]], w)  # type: ignore[type-var]
    cupyconv.conv2d(x, w, padding="full")  # type: ignore[arg-type]
    cupyconv.conv2d(x, w, stride=1.5)  # type: ignore[arg-type]
    cupyconv.conv2d(x, w, None, 1, 0, 1, 1, "direct")  # type: ignore[call-arg]
    cupyconv.set_workspace_limit("256 MiB")  # type: ignore[arg-type]
    cudnn.convolution_forward(x, w, b, y, 1, 1, None, 2)  # type: ignore[arg-type]
