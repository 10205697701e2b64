"""cupyconv: GPU convolution kernels for CuPy, NumPy and PyTorch arrays.

NumPy arrays run on the CPU path, CuPy arrays on the GPU kernels, and torch tensors cross over by DLPack
without a copy.  Every op has a hand-written backward (`*_backward`).
"""
from ._workspace import DEFAULT_WORKSPACE_LIMIT, get_workspace_limit, set_workspace_limit, workspace_limit
from .ops.conv import conv2d, conv2d_backward, get_allow_tf32, set_allow_tf32, set_autotune
from .ops.depthwise import depthwise_conv2d, depthwise_conv2d_backward
from .ops.patch import patch_conv2d, patch_conv2d_backward
from .ops.unfold import fold, fold_backward, unfold, unfold_backward

__version__ = "0.1.0"

__all__ = [
    "conv2d", "conv2d_backward", "set_allow_tf32", "get_allow_tf32", "set_autotune",
    "depthwise_conv2d", "depthwise_conv2d_backward",
    "patch_conv2d", "patch_conv2d_backward",
    "unfold", "unfold_backward", "fold", "fold_backward",
    "set_workspace_limit", "get_workspace_limit", "workspace_limit", "DEFAULT_WORKSPACE_LIMIT",
]
