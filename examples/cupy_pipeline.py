"""A convolutional network trained by hand on CuPy arrays: forward, manual backward and SGD, no framework.

    x (N, 3, H, W) -> conv2d 3x3 (16 filters, padding 1) -> ReLU
                   -> depthwise 3x3 (stride 2, padding 'same') -> ReLU
                   -> conv2d 1x1 (3 filters) -> mean over pixels -> softmax cross-entropy

Every gradient comes from cupyconv's `*_backward` functions, asking (with `needs=`) only for what the step
uses.  The same code runs on NumPy arrays: without CuPy or a GPU it runs on the CPU.

    python examples/cupy_pipeline.py                 # 40 steps, batch 64, 32x32 images, on the GPU if there is one
    python examples/cupy_pipeline.py --small         # 30 steps, batch 32, 16x16 images (CI)
    python examples/cupy_pipeline.py --device cpu    # NumPy arrays even where there is a GPU
"""
import sys
import time

import numpy

import _cli
import cupyconv

CLASSES, WIDTH = 3, 16


def synthetic_batch(rng, batch, size):
    """Noise images with a bright square anywhere in one colour channel; the label is the channel (NumPy)."""
    x = rng.standard_normal((batch, 3, size, size)).astype(numpy.float32)
    labels = rng.integers(0, CLASSES, batch)
    side = size // 2
    for i, label in enumerate(labels):
        top, left = rng.integers(0, size - side + 1, 2)
        x[i, label, top:top + side, left:left + side] += 2.0
    return x, labels


def init_params(xp, rng):
    def uniform(shape, fan_in):
        bound = 1.0 / fan_in ** 0.5
        return xp.asarray(rng.uniform(-bound, bound, shape).astype(numpy.float32))

    return {
        "w1": uniform((WIDTH, 3, 3, 3), 27), "b1": uniform(WIDTH, 27),
        "w2": uniform((WIDTH, 1, 3, 3), 9), "b2": uniform(WIDTH, 9),
        "w3": uniform((CLASSES, WIDTH, 1, 1), WIDTH), "b3": uniform(CLASSES, WIDTH),
    }


def step(xp, params, x, labels, lr):
    """One SGD step in place; returns the loss before the step."""
    p = params
    # forward
    h1 = cupyconv.conv2d(x, p["w1"], p["b1"], padding=1)
    a1 = xp.maximum(h1, 0)
    h2 = cupyconv.depthwise_conv2d(a1, p["w2"], p["b2"], stride=2, padding="same")
    a2 = xp.maximum(h2, 0)
    h3 = cupyconv.conv2d(a2, p["w3"], p["b3"])
    logits = h3.mean(axis=(2, 3))
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    n = x.shape[0]
    loss = -log_probs[xp.arange(n), labels].mean()

    # backward, by hand
    g_logits = xp.exp(log_probs)
    g_logits[xp.arange(n), labels] -= 1
    g_logits /= n
    g_h3 = xp.empty_like(h3)
    g_h3[...] = (g_logits / (h3.shape[2] * h3.shape[3]))[:, :, None, None]
    g_a2, g_w3, g_b3 = cupyconv.conv2d_backward(g_h3, a2, p["w3"])
    g_h2 = g_a2 * (h2 > 0)
    g_a1, g_w2, g_b2 = cupyconv.depthwise_conv2d_backward(g_h2, a1, p["w2"], stride=2, padding="same")
    g_h1 = g_a1 * (h1 > 0)
    _, g_w1, g_b1 = cupyconv.conv2d_backward(g_h1, x, p["w1"], padding=1, needs=("weight", "bias"))

    # SGD
    for name, grad in (("w1", g_w1), ("b1", g_b1), ("w2", g_w2), ("b2", g_b2), ("w3", g_w3), ("b3", g_b3)):
        p[name] -= lr * grad
    return float(loss)


def train(xp, steps, batch, size, lr=1.0):
    rng = numpy.random.default_rng(0)
    params = init_params(xp, rng)
    synchronize = xp.cuda.get_current_stream().synchronize if xp is not numpy else (lambda: None)
    losses, times = [], []
    for _ in range(steps):
        x, labels = synthetic_batch(rng, batch, size)
        x, labels = xp.asarray(x), xp.asarray(labels)
        start = time.perf_counter()
        losses.append(step(xp, params, x, labels, lr))     # float(loss) synchronises
        synchronize()
        times.append(time.perf_counter() - start)
    return losses, times


def main(argv=None):
    args = _cli.parser(__doc__, small="30 steps, batch 32, 16x16 images").parse_args(argv)
    steps, batch, size = (30, 32, 16) if args.small else (40, 64, 32)
    xp = _cli.array_module(_cli.device(args))
    losses, times = train(xp, steps, batch, size)

    where = "GPU, CuPy arrays" if xp is not numpy else "CPU, NumPy arrays"
    print(f"{steps} SGD steps, batch {batch}, {size}x{size} images ({where}, float32)")
    for i, (loss, seconds) in enumerate(zip(losses, times)):
        print(f"step {i:3d}  loss {loss:.4f}  {seconds * 1e3:8.2f} ms")
    median = sorted(times)[len(times) // 2]
    print(f"median step time {median * 1e3:.2f} ms (on a GPU the first steps include kernel compilation)")
    if not sum(losses[-3:]) < sum(losses[:3]):
        sys.exit("the loss did not decrease")


if __name__ == "__main__":
    main()
