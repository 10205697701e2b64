"""torch DistributedDataParallel over cupyconv.torch layers: a few SGD steps in two processes, each on half of
the batch, end with the parameters of one process trained on the whole batch.

The test runs this file as its worker, once per rank, with the environment torchrun gives (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the same worker also runs under torchrun itself:

    torchrun --nproc_per_node=2 tests/test_ddp.py OUT.pt --backend nccl      # one process per GPU, NCCL
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BATCH, STEPS, LR = 8, 4, 0.2
ROOT = Path(__file__).resolve().parent.parent


def model_and_data(device):
    """The model (float64, seeded) and the whole batch: images (8, 3, 8, 8) and targets (8, 4, 4, 4, 4)."""
    import cupyconv.torch as ct

    class Net(torch.nn.Module):
        """Conv2d, DepthwiseConv2d, then a PatchConv2d over the 4x4 patches of each image."""

        def __init__(self):
            super().__init__()
            self.conv = ct.Conv2d(3, 4, 3, padding=1, dtype=torch.float64)
            self.depthwise = ct.DepthwiseConv2d(4, 4, 3, padding="same", dtype=torch.float64)
            self.patch = ct.PatchConv2d(4, 4, 3, padding=1, dtype=torch.float64)

        def forward(self, x):
            y = self.depthwise(torch.tanh(self.conv(x)))
            n, c, h, w = y.shape                                             # (N, C, 8, 8) -> (N, 4, C, 4, 4)
            patches = y.reshape(n, c, 2, 4, 2, 4).permute(0, 2, 4, 1, 3, 5).reshape(n, 4, c, 4, 4)
            return self.patch(patches)

    torch.manual_seed(0)
    model = Net().to(device)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 3, 8, 8, dtype=torch.float64, generator=generator).to(device)
    target = torch.randn(BATCH, 4, 4, 4, 4, dtype=torch.float64, generator=generator).to(device)
    return model, x, target


def train(model, x, target):
    """STEPS of SGD on the mean squared error: a mean, so DDP's average of the ranks' gradients (equal halves
    of the batch) is the gradient of the whole batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()
    return {name: p.detach().cpu() for name, p in model.named_parameters()}


def worker(out: Path, backend: str) -> None:
    """One rank of the distributed run (environment as torchrun sets it); writes its parameters to out.<rank>."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend, rank=rank, world_size=world)
    try:
        model, x, target = model_and_data(device)
        share = BATCH // world
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        params = train(ddp, x[rank * share:(rank + 1) * share], target[rank * share:(rank + 1) * share])
        torch.save({name.removeprefix("module."): p for name, p in params.items()}, f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path: Path, backend: str, world: int = 2) -> list[dict]:
    """This file as `world` worker processes; their parameters, by rank."""
    out = tmp_path / "params"
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    ranks = [subprocess.Popen([sys.executable, __file__, str(out), "--backend", backend],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = [p.communicate(timeout=120)[0] for p in ranks]
    for r, (p, log) in enumerate(zip(ranks, logs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{log}"
    return [torch.load(f"{out}.{r}") for r in range(world)]


def check_against_one_process(ranks: list[dict], device) -> None:
    model, x, target = model_and_data(device)
    initial = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    expected = train(model, x, target)
    for rank, params in enumerate(ranks):
        assert params.keys() == expected.keys()
        for name, p in params.items():
            assert not torch.equal(p, initial[name]), f"{name} did not train"
            torch.testing.assert_close(p, expected[name], rtol=1e-12, atol=1e-12, msg=f"rank {rank}: {name}")
    for name in expected:   # every rank applied the same averaged gradients
        assert torch.equal(ranks[0][name], ranks[1][name]), name


def test_ddp_two_cpu_processes_with_gloo_equal_one_process_on_the_whole_batch(tmp_path):
    check_against_one_process(run_ranks(tmp_path, "gloo"), torch.device("cpu"))


@pytest.mark.gpu
def test_ddp_two_gpus_with_nccl_equal_one_process_on_the_whole_batch(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    check_against_one_process(run_ranks(tmp_path, "nccl"), torch.device("cuda:0"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="each rank writes its parameters to OUT.<rank>")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    arguments = parser.parse_args()
    worker(arguments.out, arguments.backend)
