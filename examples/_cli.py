"""The command line every example shares: ``--device cpu|gpu`` and ``--small``.

``--device cpu`` computes on NumPy arrays (torch CPU tensors), ``--device gpu`` on CuPy arrays (torch CUDA
tensors).  Without ``--device`` an example runs on the GPU when this machine can, else on the CPU.  Asked for the
GPU where there is none, it exits with a one-line message and status 1.  Not an example itself: CI and
tests/test_examples.py run every examples/*.py but this one.
"""
import argparse
import os
import sys

import numpy


def parser(doc: str, small: str) -> argparse.ArgumentParser:
    """The shared flags; `doc` is the example's docstring (its first paragraph describes it), `small` says what
    --small runs."""
    result = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    result.add_argument("--device", choices=("cpu", "gpu"),
                        help="cpu: NumPy arrays (torch CPU tensors); gpu: CuPy arrays (torch CUDA tensors); "
                             "default: gpu where CuPy sees a CUDA device, else cpu")
    result.add_argument("--small", action="store_true", help=f"{small} (what CI runs)")
    return result


def gpu_missing(torch=None) -> str | None:
    """Why the GPU path cannot run here, or None: CuPy must see a CUDA device, and torch, when given, too."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x, or cupyconv's cuda12/cuda13 extra)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no driver, or one too old for this CuPy: CuPy raises its own runtime errors
        return f"CuPy finds no CUDA device ({type(error).__name__})"
    if count == 0:
        return "CuPy finds no CUDA device"
    if torch is not None and not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA (a CPU-only build, or no driver)"
    return None


def device(args: argparse.Namespace, torch=None) -> str:
    """'cpu' or 'gpu': the --device asked for, or the default; --device gpu where the GPU path cannot run exits
    with a one-line message.  Pass torch when the example computes with torch tensors."""
    if args.device == "cpu":
        return "cpu"
    missing = gpu_missing(torch)
    if args.device is None:
        return "cpu" if missing else "gpu"
    if missing:
        sys.exit(f"{os.path.basename(sys.argv[0])}: --device gpu: {missing}")
    return "gpu"


def array_module(device: str):
    """numpy for 'cpu', cupy for 'gpu'."""
    if device == "gpu":
        import cupy
        return cupy
    return numpy
