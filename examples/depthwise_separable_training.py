"""Train a small MobileNet-style network with cupyconv layers and, from the same weights, with torch layers.

Both networks are built from the same description; one uses `torch.nn.Conv2d`, the other the drop-in layers
of `cupyconv.torch` (`Conv2d`, `DepthwiseSeparableConv2d`).  The cupyconv network loads the torch network's
`state_dict` as it is, both are trained for a few SGD steps on the same synthetic batches, and the losses of
every step must agree: the layers compute the same function with hand-written backward passes.

Runs on CUDA tensors where torch and CuPy both see a CUDA device (cupyconv.torch computes CUDA tensors with
CuPy), else on the CPU; --device chooses.

    python examples/depthwise_separable_training.py                # 20 steps, batch 32, 32x32 images
    python examples/depthwise_separable_training.py --small        # 4 steps, batch 8, 16x16 images (CI)
    python examples/depthwise_separable_training.py --device cpu   # CPU tensors even where there is a GPU
"""
import sys

try:
    import torch
    from torch import nn
except ImportError:
    sys.exit("depthwise_separable_training.py needs PyTorch (pip install torch)")

import _cli
import cupyconv.torch as cct

CLASSES = 3


class TorchSeparable(nn.Module):
    """Depthwise 3x3 then pointwise 1x1, in plain torch: the state_dict layout of cct.DepthwiseSeparableConv2d."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        super().__init__()
        self.depthwise = nn.Conv2d(in_channels, in_channels, kernel_size, stride, padding, groups=in_channels,
                                   bias=False)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


def mobilenet(conv, separable, width=16):
    """stem conv -> 3 depthwise-separable blocks (BatchNorm + ReLU after each) -> pool -> linear."""
    def block(layer, channels):
        return [layer, nn.BatchNorm2d(channels), nn.ReLU()]

    return nn.Sequential(
        *block(conv(3, width, 3, stride=2, padding=1), width),
        *block(separable(width, 2 * width, 3, stride=1, padding=1), 2 * width),
        *block(separable(2 * width, 4 * width, 3, stride=2, padding=1), 4 * width),
        *block(separable(4 * width, 4 * width, 3, stride=1, padding=1), 4 * width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, CLASSES))


def synthetic_batch(generator, batch, size, device):
    """Noise images with a bright square anywhere in one colour channel; the label is the channel."""
    x = torch.randn(batch, 3, size, size, generator=generator)
    labels = torch.randint(0, CLASSES, (batch,), generator=generator)
    side = size // 4
    for i, label in enumerate(labels.tolist()):
        top, left = torch.randint(0, size - side + 1, (2,), generator=generator).tolist()
        x[i, label, top:top + side, left:left + side] += 2.0
    return x.to(device), labels.to(device)


def train(model, batches, lr=0.05):
    optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x, labels in batches:
        loss = nn.functional.cross_entropy(model(x), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def run(device, steps, batch, size):
    torch.manual_seed(0)
    reference = mobilenet(nn.Conv2d, TorchSeparable).to(device)
    ours = mobilenet(cct.Conv2d, cct.DepthwiseSeparableConv2d).to(device)
    ours.load_state_dict(reference.state_dict())             # torch weights load into cupyconv layers as they are
    generator = torch.Generator().manual_seed(1)
    batches = [synthetic_batch(generator, batch, size, device) for _ in range(steps)]
    return train(reference, batches), train(ours, batches)


def main(argv=None):
    args = _cli.parser(__doc__, small="4 steps of batch 8 on 16x16 images").parse_args(argv)
    steps, batch, size = (4, 8, 16) if args.small else (20, 32, 32)

    device = "cuda" if _cli.device(args, torch) == "gpu" else "cpu"
    if device == "cuda":
        torch.backends.cudnn.allow_tf32 = False               # compare strict float32 with strict float32
        torch.backends.cuda.matmul.allow_tf32 = False
    torch_losses, our_losses = run(device, steps, batch, size)

    print(f"MobileNet-style network, {steps} SGD steps, batch {batch}, {size}x{size} images, on {device}")
    print(f"{'step':>4s} {'torch layers':>14s} {'cupyconv layers':>16s} {'|difference|':>13s}")
    worst = 0.0
    for step, (a, b) in enumerate(zip(torch_losses, our_losses)):
        worst = max(worst, abs(a - b) / max(abs(a), 1e-6))
        print(f"{step:4d} {a:14.7f} {b:16.7f} {abs(a - b):13.2e}")
    print(f"largest relative difference: {worst:.2e}")
    if worst > 1e-3:
        sys.exit("the cupyconv network's losses drift from the torch network's")
    if steps >= 10 and not sum(torch_losses[-3:]) < sum(torch_losses[:3]):
        sys.exit("the loss did not decrease")


if __name__ == "__main__":
    main()
