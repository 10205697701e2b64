"""A patch-convolution network trained by hand with NumPy's API: forward, manual backward and SGD.

    images (B, 3, 16, 16) -> 16 patches of 4x4 each (cupyconv.unfold, stride 4) -> (B, 16, 3, 4, 4)
      -> patch_conv2d 3x3 (8 filters, padding 1 inside each patch) -> ReLU -> mean over each patch's pixels
      -> (B, 16 * 8) features -> linear layer -> softmax cross-entropy

Before training, the hand-written gradient of the whole network (cupyconv's `patch_conv2d_backward` plus
the few lines of NumPy for the rest) is checked against central finite differences in float64.  The arrays are
NumPy's on the CPU; with --device gpu (the default where CuPy sees a CUDA device) the same code runs on CuPy's.

    python examples/numpy_pipeline.py                 # 60 steps, batch 64
    python examples/numpy_pipeline.py --small         # 30 steps, batch 32 (CI)
    python examples/numpy_pipeline.py --device cpu    # NumPy arrays even where there is a GPU
"""
import sys

import numpy

import _cli
import cupyconv

SIZE, PATCH, CHANNELS, FILTERS, CLASSES = 16, 4, 3, 8, 4
PATCHES = (SIZE // PATCH) ** 2


def synthetic_batch(rng, batch):
    """Noise images with a bright square in one of the 4 quadrants; the label is the quadrant."""
    x = rng.standard_normal((batch, CHANNELS, SIZE, SIZE))
    labels = rng.integers(0, CLASSES, batch)
    half = SIZE // 2
    for i, label in enumerate(labels):
        top, left = (label // 2) * half, (label % 2) * half
        x[i, :, top + 2:top + half - 2, left + 2:left + half - 2] += 1.5
    return x, labels


def to_patches(images):
    """(B, C, H, W) -> (B, P, C, 4, 4): the non-overlapping 4x4 patches, row by row."""
    cols = cupyconv.unfold(images, PATCH, stride=PATCH)                  # (B, C * 4 * 4, P)
    b = images.shape[0]
    return cols.reshape(b, CHANNELS, PATCH, PATCH, PATCHES).transpose(0, 4, 1, 2, 3)


def init_params(xp, rng):
    fan_in = CHANNELS * 9
    return {
        "w": xp.asarray(rng.uniform(-1, 1, (FILTERS, CHANNELS, 3, 3)) / fan_in ** 0.5),
        "b": xp.asarray(rng.uniform(-1, 1, FILTERS) / fan_in ** 0.5),
        "v": xp.asarray(rng.standard_normal((PATCHES * FILTERS, CLASSES)) * 0.1),
        "c": xp.zeros(CLASSES),
    }


def loss_and_grads(xp, params, patches, labels):
    """(the loss as a float, the gradient of every parameter); labels is an array of xp."""
    p = params
    h = cupyconv.patch_conv2d(patches, p["w"], p["b"], padding=1)      # (B, P, D, 4, 4)
    a = xp.maximum(h, 0)
    features = a.mean(axis=(3, 4)).reshape(len(labels), -1)           # (B, P * D)
    logits = features @ p["v"] + p["c"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    n = len(labels)
    loss = -log_probs[xp.arange(n), labels].mean()

    g_logits = xp.exp(log_probs)
    g_logits[xp.arange(n), labels] -= 1
    g_logits /= n
    grads = {"v": features.T @ g_logits, "c": g_logits.sum(axis=0)}
    g_features = (g_logits @ p["v"].T).reshape(h.shape[:3])
    g_h = xp.broadcast_to(g_features[..., None, None] / (PATCH * PATCH), h.shape) * (h > 0)
    _, grads["w"], grads["b"] = cupyconv.patch_conv2d_backward(g_h, patches, p["w"], padding=1,
                                                               needs=("weight", "bias"))
    return float(loss), grads


def training_batch(xp, rng, size):
    """A synthetic batch as arrays of xp: (patches (B, P, C, 4, 4), labels (B,))."""
    x, labels = synthetic_batch(rng, size)
    return to_patches(xp.asarray(x)), xp.asarray(labels)


def check_gradients(xp, rng, samples=6, eps=1e-6):
    """Largest relative error of the manual gradient against central differences, over a few entries."""
    params = init_params(xp, rng)
    patches, labels = training_batch(xp, rng, 4)
    _, grads = loss_and_grads(xp, params, patches, labels)
    worst = 0.0
    for name, value in params.items():
        for index in zip(*(rng.integers(0, n, samples) for n in value.shape)):
            saved = value[index]
            value[index] = saved + eps
            up, _ = loss_and_grads(xp, params, patches, labels)
            value[index] = saved - eps
            down, _ = loss_and_grads(xp, params, patches, labels)
            value[index] = saved
            numeric = (up - down) / (2 * eps)
            worst = max(worst, abs(numeric - float(grads[name][index])) / max(abs(numeric), 1e-3))
    return worst


def main(argv=None):
    args = _cli.parser(__doc__, small="30 steps of batch 32").parse_args(argv)
    steps, size, lr = (30, 32, 0.5) if args.small else (60, 64, 0.5)
    xp = _cli.array_module(_cli.device(args))
    rng = numpy.random.default_rng(0)

    error = check_gradients(xp, rng)
    print(f"manual gradient vs central differences (float64): largest relative error {error:.1e}")
    if error > 1e-5:
        sys.exit("the manual gradient disagrees with finite differences")

    params = init_params(xp, rng)
    losses = []
    for i in range(steps):
        loss, grads = loss_and_grads(xp, params, *training_batch(xp, rng, size))
        for name, grad in grads.items():
            params[name] -= lr * grad
        losses.append(loss)
        if i % 5 == 0 or i == steps - 1:
            print(f"step {i:3d}  loss {loss:.4f}")
    if not sum(losses[-3:]) < sum(losses[:3]):
        sys.exit("the loss did not decrease")


if __name__ == "__main__":
    main()
