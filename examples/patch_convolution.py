"""Patch convolution, the problem cupyconv was started for: the same filters over many tiny patches.

N = 20,480 patches of 4x4 pixels with C = 32 channels, convolved with D = 64 filters of 3x3 and padding 1
inside each patch (nothing is read across patches), laid out as (B, P, C, 4, 4) = (20, 1024, 32, 4, 4).

The script runs `cupyconv.patch_conv2d`, checks it against the usual workaround, a torch convolution over
the patches rolled into the batch dimension (without torch: against `cupyconv.conv2d` on that rolled batch),
and prints a timing table of the alternatives it can run here: cupyconv, torch F.conv2d on the rolled batch,
and torch unfold + matmul.

With --device gpu (the default where CuPy sees a CUDA device) everything runs there, CuPy arrays and torch CUDA
tensors (when torch has CUDA); with --device cpu on NumPy arrays and torch CPU tensors.  Only NumPy is required.

    python examples/patch_convolution.py             # the full problem
    python examples/patch_convolution.py --small     # B = 4, P = 64: a few seconds, what CI runs
    python examples/patch_convolution.py --device cpu --repeat 20
"""
import statistics
import sys
import time

import numpy

import _cli
import cupyconv

C, D, PATCH, KERNEL, PADDING = 32, 64, 4, 3, 1


def _optional(name):
    try:
        return __import__(name)
    except ImportError:
        return None


def median_time(fn, synchronize, repeat, warmup=2):
    """(median, min) wall time of fn() in seconds: `warmup` untimed runs, then `repeat` timed ones, each
    ended by `synchronize` so asynchronous GPU work is inside the measurement."""
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def run(xp, batch, repeat):
    """Check and time the problem with arrays of module xp (numpy or cupy); returns the result rows."""
    on_gpu = xp is not numpy
    torch = _optional("torch")
    if on_gpu and torch is not None and not torch.cuda.is_available():
        torch = None  # a CPU-only torch: nothing of it to compare on the GPU
    rng = numpy.random.default_rng(0)
    shape = (*batch, C, PATCH, PATCH)
    n = shape[0] * shape[1]
    x = xp.asarray(rng.standard_normal(shape, dtype=numpy.float32))
    w = rng.standard_normal((D, C, KERNEL, KERNEL), dtype=numpy.float32) / numpy.float32((C * KERNEL ** 2) ** 0.5)
    w = xp.asarray(w)
    b = xp.asarray(rng.standard_normal(D, dtype=numpy.float32))

    y = cupyconv.patch_conv2d(x, w, b, padding=PADDING)                     # (B, P, D, 4, 4)

    if on_gpu:
        sync_xp = xp.cuda.get_current_stream().synchronize
    else:
        def sync_xp():
            pass

    if torch is not None:
        import torch.nn.functional as F
        device = "cuda" if on_gpu else "cpu"
        torch.backends.cudnn.allow_tf32 = False        # strict float32 on the GPU, like cupyconv
        torch.backends.cuda.matmul.allow_tf32 = False
        tx, tw, tb = (torch.from_dlpack(a) if on_gpu else torch.from_numpy(a) for a in (x, w, b))
        rolled = tx.reshape(n, C, PATCH, PATCH)                               # patches rolled into the batch
        expected = F.conv2d(rolled, tw, tb, padding=PADDING).reshape(*batch, D, PATCH, PATCH)
        expected = xp.from_dlpack(expected) if on_gpu else expected.numpy()
        reference = f"torch F.conv2d on the rolled batch ({device})"

        def sync_torch():
            if on_gpu:
                torch.cuda.synchronize()

        def unfold_matmul():
            cols = F.unfold(rolled, KERNEL, padding=PADDING)                   # (N, C * 9, 16)
            out = torch.matmul(tw.reshape(D, -1), cols) + tb[:, None]        # (N, D, 16)
            return out.reshape(*batch, D, PATCH, PATCH)
    else:
        expected = cupyconv.conv2d(x.reshape(n, C, PATCH, PATCH), w, b, padding=PADDING).reshape(y.shape)
        reference = "cupyconv.conv2d on the rolled batch (torch is not installed)"

    error = float(abs(y - expected).max())
    scale = float(abs(expected).max())
    print(f"checked against {reference}: max |difference| = {error:.2e} (largest value {scale:.2f})")
    if not error <= 1e-4 * max(scale, 1.0):
        sys.exit(f"patch_conv2d disagrees with the reference: max |difference| {error:.3e}")

    contenders = [("cupyconv.patch_conv2d", lambda: cupyconv.patch_conv2d(x, w, b, padding=PADDING), sync_xp)]
    if torch is not None:
        import cupyconv.torch as cct
        contenders += [
            ("cupyconv.torch.patch_conv2d (tensors)", lambda: cct.patch_conv2d(tx, tw, tb, padding=PADDING),
             sync_torch),
            ("torch F.conv2d, rolled batch", lambda: F.conv2d(rolled, tw, tb, padding=PADDING), sync_torch),
            ("torch unfold + matmul", unfold_matmul, sync_torch),
        ]
    rows = []
    for name, fn, synchronize in contenders:
        median, best = median_time(fn, synchronize, repeat)
        rows.append((name, median, best, n / median))
    return rows


def main(argv=None):
    parser = _cli.parser(__doc__, small="4 x 64 patches instead of 20 x 1024")
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per contender (median reported)")
    args = parser.parse_args(argv)

    batch = (4, 64) if args.small else (20, 1024)
    repeat = args.repeat or 5
    xp = _cli.array_module(_cli.device(args))

    n = batch[0] * batch[1]
    print(f"patch convolution: {n} patches (B={batch[0]}, P={batch[1]}) of {PATCH}x{PATCH}, C={C} -> D={D}, "
          f"kernel {KERNEL}x{KERNEL}, padding {PADDING} inside each patch, float32")
    if xp is not numpy:
        print(f"device: GPU {xp.cuda.runtime.getDeviceProperties(0)['name'].decode()} (CuPy {xp.__version__})")
    else:
        print(f"device: CPU (NumPy {numpy.__version__})")
    rows = run(xp, batch, repeat)

    print(f"\n{'contender':40s} {'median ms':>10s} {'min ms':>9s} {'patches/s':>12s}")
    for name, median, best, rate in rows:
        print(f"{name:40s} {median * 1e3:10.3f} {best * 1e3:9.3f} {rate:12.3g}")
    print(f"(median and minimum of {repeat} runs after 2 warm-up runs; GPU runs synchronised)")


if __name__ == "__main__":
    main()
