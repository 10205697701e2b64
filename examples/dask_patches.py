"""Patch convolution over more patches than memory holds, with dask: chunks of patches on several workers.

The patch set, B samples of P = 20,480 patches of 4x4 pixels with C = 32 channels, (B, P, C, 4, 4), is never
held in memory: dask generates it chunk by chunk (random numbers, standing in for patches read from disk), each
chunk is convolved with D = 64 filters of 3x3 (`cupyconv.patch_conv2d`, padding 1 inside every patch) where it
was made, and reduced at once to two small results:

    features  (B, D)          the mean of relu(y) over every patch and pixel of a sample
    grad_w    (D, C, 3, 3)    the gradient of features.sum() with respect to the filters
                              (`cupyconv.patch_conv2d_backward`, one partial per chunk, summed in a fixed order)

Each worker holds a few chunks at a time, so --samples can grow past the memory of the machine (or of the
GPUs): 64 samples (the default) are 2.7 GB of patches and 5.4 GB of convolved patches.

    python examples/dask_patches.py --small              # 2 samples of 512 small patches, checked in memory (CI)
    python examples/dask_patches.py --samples 256        # NumPy chunks on a LocalCluster, one process per core
    python examples/dask_patches.py --device gpu         # CuPy chunks: one worker per GPU with dask-cuda
                                                         # installed (pip install dask-cuda), else one GPU

Needs dask and distributed (`pip install -e ".[dask]"`); --device gpu needs CuPy and a CUDA GPU.
"""
import os
import sys
import time

import _cli
import numpy

import cupyconv

PATCH, KERNEL = 4, 3


def start_cluster(xp):
    """A local dask cluster: one worker process per GPU (dask-cuda) or per core (at most 4)."""
    import distributed
    if xp is numpy:
        return distributed.LocalCluster(n_workers=min(4, os.cpu_count() or 1), threads_per_worker=1,
                                        dashboard_address=None)
    try:
        from dask_cuda import LocalCUDACluster
        return LocalCUDACluster(dashboard_address=None)
    except ImportError:
        print("dask-cuda is not installed: one worker on the current GPU")
        return distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)


def patch_set(xp, samples, patches, channels, chunk):
    """(samples, patches, channels, 4, 4) float32, generated lazily chunk by chunk on the workers."""
    import dask.array as da
    rng = da.random.default_rng(xp.random.default_rng(0))
    return rng.standard_normal((samples, patches, channels, PATCH, PATCH), dtype=xp.float32,
                               chunks=(1, chunk, channels, PATCH, PATCH))


def pipeline(x, weight, bias):
    """features (B, D) and grad_w (D, C, 3, 3), lazily; works on dask and in-memory arrays alike."""
    y = cupyconv.patch_conv2d(x, weight, bias, padding=1)                  # (B, P, D, 4, 4)
    pixels = y.shape[1] * PATCH * PATCH
    features = (y * (y > 0)).sum(axis=(1, 3, 4)) / pixels                # mean of relu(y) per sample
    grad_y = (y > 0).astype(y.dtype) / y.dtype.type(pixels)               # d features.sum() / dy
    _, grad_w, _ = cupyconv.patch_conv2d_backward(grad_y, x, weight, padding=1, needs="weight")
    return features, grad_w


def main():
    parser = _cli.parser(__doc__, "2 samples of 512 patches, 8 -> 16 channels, checked against the in-memory "
                                  "computation")
    parser.add_argument("--samples", type=int, default=64, help="samples B (default 64)")
    args = parser.parse_args()
    xp = _cli.array_module(_cli.device(args))
    try:
        import distributed
    except ImportError:
        sys.exit('dask_patches.py: needs dask and distributed: pip install -e ".[dask]"')

    samples, patches, channels, filters, chunk = (2, 512, 8, 16, 128) if args.small else \
        (args.samples, 20_480, 32, 64, 2_048)
    rng = numpy.random.default_rng(1)
    weight = xp.asarray(rng.standard_normal((filters, channels, KERNEL, KERNEL), dtype=numpy.float32) / 10)
    bias = xp.asarray(rng.standard_normal(filters, dtype=numpy.float32) / 10)
    x = patch_set(xp, samples, patches, channels, chunk)
    features, grad_w = pipeline(x, weight, bias)
    gigabytes = x.nbytes / 1e9
    print(f"{samples} samples x {patches} patches of {channels} x {PATCH}x{PATCH}: {gigabytes:.3g} GB of patches in "
          f"{x.npartitions} chunks of {chunk} patches; {filters} filters of {KERNEL}x{KERNEL}, "
          f"{'CuPy' if xp is not numpy else 'NumPy'} chunks")

    with start_cluster(xp) as cluster, distributed.Client(cluster) as client:
        print(f"{len(client.scheduler_info()['workers'])} dask workers")
        start = time.perf_counter()
        futures = client.compute([features, grad_w])
        distributed.progress(futures)
        features_value, grad_w_value = client.gather(futures)
        seconds = time.perf_counter() - start
    print(f"\n{seconds:.2f} s: {samples * patches / seconds:,.0f} patches/s, {gigabytes / seconds:.3g} GB/s of patches")
    print(f"features {features_value.shape}, first sample: {numpy.round(_host(features_value[0, :4]), 4)} ...")
    print(f"grad_w {grad_w_value.shape}, norm {float((grad_w_value ** 2).sum()) ** 0.5:.4g}")

    if args.small:   # the same pipeline on the whole patch set in memory
        expected = pipeline(x.compute(scheduler="threads"), weight, bias)
        for name, got, want in (("features", features_value, expected[0]), ("grad_w", grad_w_value, expected[1])):
            numpy.testing.assert_allclose(_host(got), _host(want), rtol=1e-4, atol=1e-5, err_msg=name)
        print("matches the in-memory computation")


def _host(a):
    return a.get() if hasattr(a, "get") else a


if __name__ == "__main__":
    main()
