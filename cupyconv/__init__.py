"""cupyconv: GPU convolution kernels for CuPy, NumPy and PyTorch arrays.

NumPy arrays run on the CPU path, CuPy arrays on the GPU kernels, and torch tensors cross over by DLPack
without a copy; dask arrays (NumPy or CuPy chunks) give lazy dask arrays (cupyconv/_dask.py).  Every op has a
hand-written backward (`*_backward`).
"""
from . import settings
from .ops.conv import conv2d, conv2d_backward
from .ops.conv_transpose import (conv_transpose1d, conv_transpose1d_backward, conv_transpose2d,
                                 conv_transpose2d_backward, conv_transpose3d, conv_transpose3d_backward,
                                 conv_transpose_nd, conv_transpose_nd_backward)
from .ops.depthwise import depthwise_conv2d, depthwise_conv2d_backward
from .ops.nd import (conv1d, conv1d_backward, conv3d, conv3d_backward, conv_nd, conv_nd_backward, depthwise_conv1d,
                     depthwise_conv1d_backward, depthwise_conv3d, depthwise_conv3d_backward, patch_conv1d,
                     patch_conv1d_backward, patch_conv3d, patch_conv3d_backward)
from .ops.patch import patch_conv2d, patch_conv2d_backward
from .ops.unfold import fold, fold_backward, unfold, unfold_backward
from .settings import (DEFAULT_WORKSPACE_LIMIT, get_allow_tf32, get_autotune, get_deterministic, get_workspace_limit,
                       set_allow_tf32, set_autotune, set_deterministic, set_workspace_limit, workspace_limit)

from . import cudnn  # noqa: E402  (the cupy.cudnn drop-in; needs the ops above)
from . import _dask  # noqa: E402  (imports no dask: that happens at the first call with a dask array)

for _name in _dask.OPS:   # every op and backward also takes dask arrays, lazily
    globals()[_name] = _dask.accepting_dask(globals()[_name])
del _name

__version__ = "0.1.0"

__all__ = [
    "conv1d", "conv1d_backward", "conv2d", "conv2d_backward", "conv3d", "conv3d_backward",
    "conv_nd", "conv_nd_backward",
    "conv_transpose1d", "conv_transpose1d_backward", "conv_transpose2d", "conv_transpose2d_backward",
    "conv_transpose3d", "conv_transpose3d_backward", "conv_transpose_nd", "conv_transpose_nd_backward",
    "depthwise_conv1d", "depthwise_conv1d_backward", "depthwise_conv2d", "depthwise_conv2d_backward",
    "depthwise_conv3d", "depthwise_conv3d_backward",
    "patch_conv1d", "patch_conv1d_backward", "patch_conv2d", "patch_conv2d_backward",
    "patch_conv3d", "patch_conv3d_backward",
    "unfold", "unfold_backward", "fold", "fold_backward",
    "cudnn",
    # Settings (cupyconv.settings holds them all, with their context managers)
    "settings", "set_allow_tf32", "get_allow_tf32", "set_autotune", "get_autotune", "set_deterministic",
    "get_deterministic", "set_workspace_limit", "get_workspace_limit", "workspace_limit", "DEFAULT_WORKSPACE_LIMIT",
]
