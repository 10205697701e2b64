"""PyTorch integration: custom ops, autograd Functions, functional wrappers and `nn.Module` layers.

This is the only package of cupyconv that imports torch; `import cupyconv` works without it.

Layers of this package, from the bottom up, one module each:

* `cuda.py`: `cuda_context(device)`: while it is active, CuPy launches its kernels and cuBLAS calls on torch's
  current stream and takes its memory from torch's caching allocator.  Every op below runs inside it for CUDA
  tensors.
* `_custom_ops.py`: custom ops `torch.ops.cupyconv.<op>` (`torch.library.custom_op`), one per forward op and one
  per manual backward: `conv2d`, `conv2d_backward`, `depthwise_conv2d`, `depthwise_conv2d_backward`,
  `patch_conv2d`, `patch_conv2d_backward`, `unfold`, `unfold_backward`, `fold`, `fold_backward`.  Each has a
  fake (meta) implementation, so `torch.compile(model, fullgraph=True)` traces them without a graph break;
  padding is passed normalised as [top, bottom, left, right].  The autocast kernels (below) are registered
  here too.
* `autograd.py`: one `torch.autograd.Function` per forward op (`Conv2dFunction`, ...), whose `backward` calls the
  matching backward op (that is, cupyconv's manual `*_backward`) for only the gradients `ctx.needs_input_grad`
  asks for.  Its `setup_context`/`backward` are also the autograd formula registered on the custom op.
* `functional.py`: functional wrappers `conv2d`, `depthwise_conv2d`, `patch_conv2d`, `unfold`, `fold` with
  torch's signatures, which normalise and validate the arguments with `ConvSpec` and call the custom op.
* `modules.py`: modules `Conv2d`, `DepthwiseConv2d`, `PatchConv2d`, `DepthwiseSeparableConv2d`, with
  `torch.nn.Conv2d`'s constructor arguments, parameter names, initialisation and `state_dict` layout.

Autocast: under `torch.autocast(device_type, dtype=...)` the three convolutions cast their floating-point
inputs (float64 excepted, as torch does for its own convolutions) to the autocast dtype of that device and
return that dtype; `unfold` and `fold` run in their input's dtype (as `torch.nn.functional.unfold` does).
On the CPU, bfloat16 is computed in float32 and rounded (NumPy has no bfloat16), float16 is computed in float32.

Double backward: `unfold` and `fold` (linear) support it; the convolutions' backward ops do not.
"""
import torch

if not (hasattr(torch.library, "custom_op") and hasattr(torch, "get_autocast_dtype")):
    raise ImportError(f"cupyconv.torch needs torch >= 2.4 (torch.library.custom_op, torch.get_autocast_dtype); "
                      f"found torch {torch.__version__}")

# Importing `autograd` first imports `_custom_ops`, which registers the ops (with their fake and autocast
# kernels); `autograd` then registers its Functions as their autograd formulas.  `functional` and `modules` only
# call the ops, so every entry point is complete once this package is imported.
from .autograd import (Conv2dFunction, DepthwiseConv2dFunction, FoldBackwardFunction, FoldFunction,  # noqa: E402
                       PatchConv2dFunction, UnfoldBackwardFunction, UnfoldFunction)
from .cuda import cuda_context  # noqa: E402
from .functional import conv2d, depthwise_conv2d, fold, patch_conv2d, unfold  # noqa: E402
from .modules import Conv2d, DepthwiseConv2d, DepthwiseSeparableConv2d, PatchConv2d  # noqa: E402

__all__ = [
    "conv2d", "depthwise_conv2d", "patch_conv2d", "unfold", "fold",
    "Conv2dFunction", "DepthwiseConv2dFunction", "PatchConv2dFunction",
    "UnfoldFunction", "UnfoldBackwardFunction", "FoldFunction", "FoldBackwardFunction",
    "Conv2d", "DepthwiseConv2d", "PatchConv2d", "DepthwiseSeparableConv2d",
    "cuda_context",
]
