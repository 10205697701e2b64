"""PyTorch integration: custom ops, autograd Functions, functional wrappers and `nn.Module` layers.

This is the only package of cupyconv that imports torch; `import cupyconv` works without it.

Layers of this package, from the bottom up, one module each:

* `cpu.py`: CPU tensors run torch's own CPU convolutions (`torch.ops.aten.convolution` and its backward) behind
  the custom ops below, several times faster than the NumPy path; `set_numpy_cpu_path(True)` /
  ``with numpy_cpu_path(True):`` run cupyconv's NumPy path instead (the tests cover both).
* `cuda.py`: `cuda_context(device)`: while it is active, CuPy launches its kernels and cuBLAS calls on torch's
  current stream and takes its memory from torch's caching allocator.  Every op below runs inside it for CUDA
  tensors.
* `_custom_ops.py`: custom ops `torch.ops.cupyconv.<op>` (`torch.library.custom_op`), one per forward op and one
  per manual backward, the convolutions from one template: `conv1d`, `conv2d`, `conv3d`, `patch_conv2d`,
  `depthwise_conv2d`, `conv_transpose1d`, `conv_transpose2d`, `conv_transpose3d` (each with `<op>_backward`),
  and `unfold`, `unfold_backward`, `fold`, `fold_backward`.  Each has a fake (meta) implementation, so
  `torch.compile(model, fullgraph=True)` and `torch.export` trace them without a graph break and meta tensors
  get meta outputs; padding is passed normalised as [low, high] per spatial dim, and the options `algorithm`
  and `workspace_limit` travel in the schema to the forward and the backward op.  The autocast kernels (below)
  are registered here too.  `call(name, *args)` is how the layers above call an op: on CUDA tensors in plain eager
  mode it runs the op's implementation without torch's dispatcher (whose Python glue cost more host time than the
  whole plain call), in the op's eager Function where a gradient is needed; otherwise the custom op.
* `autograd.py`: the autograd formulas of every op, written with the ops themselves, so every convolution has
  gradients of any order: the forward op's calls the backward op for only the gradients
  `ctx.needs_input_grad` asks for; the backward op's (double backward) calls the forward and backward ops (the
  module docstring has the algebra).  `Conv2dFunction`, `PatchConv2dFunction`, `DepthwiseConv2dFunction` and
  the unfold/fold Functions expose the same formulas as `torch.autograd.Function` classes.
* `functional.py`: functional wrappers `conv1d`, `conv2d`, `conv3d`, `depthwise_conv2d`, `patch_conv2d`,
  `conv_transpose1d/2d/3d`, `unfold`, `fold` with torch's signatures and conventions (unbatched inputs,
  channels-last outputs for channels-last inputs), which normalise and validate the arguments with `ConvSpec`
  and call the op (`_custom_ops.call`).
* `modules.py`: `Conv1d`, `Conv2d`, `Conv3d`, `ConvTranspose1d/2d/3d`, `DepthwiseConv2d`, `PatchConv2d`
  subclass the matching `torch.nn` class (the last two `torch.nn.Conv2d`) and override only the computation;
  `DepthwiseSeparableConv2d` holds a `DepthwiseConv2d` and a 1x1 `Conv2d`.  `convert(model)` swaps a model's
  torch convolution layers for these (state kept), `unconvert(model)` swaps them back.

Autocast: under `torch.autocast(device_type, dtype=...)` the convolutions cast their floating-point
inputs (float64 excepted, as torch does for its own convolutions) to the autocast dtype of that device and
return that dtype; `unfold` and `fold` run in their input's dtype (as `torch.nn.functional.unfold` does).
On the CPU, bfloat16 is computed in float32 and rounded (NumPy has no bfloat16), float16 is computed in float32.

Double backward: every op supports it (gradients of any order), through the same custom ops.

`torch.jit.script` of the modules raises a TypeError that says so (TorchScript cannot call cupyconv's Python);
`torch.jit.trace` records the custom ops.
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
from .cpu import get_numpy_cpu_path, numpy_cpu_path, set_numpy_cpu_path  # noqa: E402
from .cuda import cuda_context  # noqa: E402
from .functional import (conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d,  # noqa: E402
                         depthwise_conv2d, fold, patch_conv2d, unfold)
from .modules import (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,  # noqa: E402
                      DepthwiseConv2d, DepthwiseSeparableConv2d, PatchConv2d, convert, unconvert)

__all__ = [
    "conv1d", "conv2d", "conv3d", "depthwise_conv2d", "patch_conv2d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "unfold", "fold",
    "Conv2dFunction", "DepthwiseConv2dFunction", "PatchConv2dFunction",
    "UnfoldFunction", "UnfoldBackwardFunction", "FoldFunction", "FoldBackwardFunction",
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "DepthwiseConv2d", "PatchConv2d", "DepthwiseSeparableConv2d", "convert", "unconvert",
    "cuda_context", "set_numpy_cpu_path", "get_numpy_cpu_path", "numpy_cpu_path",
]
