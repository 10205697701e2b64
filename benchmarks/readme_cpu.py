"""The CPU figures in README.md ("Performance"): cupyconv's NumPy path against torch's CPU convolution.

Three problems, forward and backward (input, weight and bias gradients), float32:

- the README's main example (examples/patch_convolution.py): 20,480 patches of 32 x 4 x 4, 64 filters 3 x 3,
  padding 1 inside each patch; torch runs `F.conv2d` on the patches rolled into the batch;
- a ResNet 3 x 3 layer, conv2d of (8, 64, 56, 56) with 64 filters, padding 1 (the README's conv2d example);
- a deeper ResNet 3 x 3 layer, conv2d of (8, 256, 14, 14) with 256 filters, padding 1.

torch's backward is `torch.ops.aten.convolution_backward`, the call its autograd makes.  The contenders take
turns round by round (so a busy neighbour slows both alike); the figures are medians.  For one thread each, set
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 (torch and NumPy's OpenBLAS read them at start).  It prints a Markdown
table and, with --json, writes the times with the machine, the versions and the load average.

    PYTHONPATH=. python -m benchmarks.readme_cpu --rounds 9 --json cpu-readme.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy

import cupyconv


def _problems():
    """(name, x shape, weight shape, patch?) of each problem."""
    return [
        ("main example: patch_conv2d, 20,480 patches 32x4x4, 64 filters 3x3", (20, 1024, 32, 4, 4), (64, 32, 3, 3), True),
        ("ResNet layer: conv2d (8, 64, 56, 56), 64 filters 3x3", (8, 64, 56, 56), (64, 64, 3, 3), False),
        ("ResNet layer: conv2d (8, 256, 14, 14), 256 filters 3x3", (8, 256, 14, 14), (256, 256, 3, 3), False),
    ]


def _contenders(torch, x_shape, w_shape, patch, rng):
    """{(library, pass): function} for one problem."""
    x = rng.standard_normal(x_shape, dtype=numpy.float32)
    w = rng.standard_normal(w_shape, dtype=numpy.float32) / numpy.float32(numpy.sqrt(numpy.prod(w_shape[1:])))
    b = rng.standard_normal(w_shape[0], dtype=numpy.float32)
    fwd = cupyconv.patch_conv2d if patch else cupyconv.conv2d
    bwd = cupyconv.patch_conv2d_backward if patch else cupyconv.conv2d_backward
    y = fwd(x, w, b, padding=1)
    g = rng.standard_normal(y.shape, dtype=numpy.float32)
    tx = torch.from_numpy(x.reshape(-1, *x_shape[-3:]))      # the patches rolled into the batch
    tw, tb = torch.from_numpy(w), torch.from_numpy(b)
    tg = torch.from_numpy(g.reshape(-1, *g.shape[-3:]))
    ty = torch.nn.functional.conv2d(tx, tw, tb, padding=1)
    numpy.testing.assert_allclose(ty.numpy().reshape(y.shape), y, rtol=1e-3, atol=1e-3)

    def torch_bwd():
        return torch.ops.aten.convolution_backward(tg, tx, tw, [w_shape[0]], [1, 1], [1, 1], [1, 1], False,
                                                   [0, 0], 1, [True, True, True])

    return {
        ("cupyconv (NumPy)", "forward"): lambda: fwd(x, w, b, padding=1),
        ("torch CPU", "forward"): lambda: torch.nn.functional.conv2d(tx, tw, tb, padding=1),
        ("cupyconv (NumPy)", "backward"): lambda: bwd(g, x, w, padding=1),
        ("torch CPU", "backward"): torch_bwd,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per contender (after 2 warm-ups)")
    parser.add_argument("--json", help="write the times here")
    args = parser.parse_args(argv)

    import torch
    rng = numpy.random.default_rng(0)
    load_before = os.getloadavg()
    rows = []
    for name, x_shape, w_shape, patch in _problems():
        fns = _contenders(torch, x_shape, w_shape, patch, rng)
        for fn in fns.values():
            fn(), fn()
        times: dict = {key: [] for key in fns}
        for _ in range(args.rounds):
            for key, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
        for pass_ in ("forward", "backward"):
            ours = statistics.median(times[("cupyconv (NumPy)", pass_)]) * 1e3
            theirs = statistics.median(times[("torch CPU", pass_)]) * 1e3
            rows.append({"problem": name, "pass": pass_, "cupyconv_ms": ours, "torch_ms": theirs,
                         "ratio": ours / theirs,
                         "all_ms": {f"{k[0]} {k[1]}": [t * 1e3 for t in v] for k, v in times.items() if k[1] == pass_}})
            print(f"| {name} | {pass_} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.1f}x |", flush=True)
    info = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "numpy": numpy.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ},
        "cupyconv": cupyconv.__version__, "rounds": args.rounds, "rows": rows,
    }
    print(f"load average before {load_before}, after {info['loadavg_after']}; torch threads {info['torch_threads']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
