"""benchmarks/cases.py's issue-13 GPU cases (conv1d, conv3d, conv_transpose2d) where CI has no GPU: the table, the
shapes against torch's, the roofline arithmetic, and the harness running their smoke versions on the CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) leaves the checkout off the path
    sys.path.append(str(ROOT))

from benchmarks import cases  # noqa: E402


def test_the_issue13_tag_selects_every_nd_case_in_fp32_and_fp16():
    chosen = cases.select(["issue13"], ("gpu",))
    assert chosen == cases.ND_CASES
    assert {(c.op, c.precision) for c in chosen} == {(op, dtype) for op in cases.ND_OPS
                                                     for dtype in ("float32", "float16")}
    assert not cases.check_table()
    assert not [c for c in cases.CASES if c.op in cases.ND_OPS], "N-d cases belong in ND_CASES (tests/test_sass.py)"


@pytest.mark.parametrize("case", cases.ND_CASES + [cases.smoke(c) for c in cases.ND_CASES], ids=lambda c: c.label)
def test_shapes_are_torchs(case):
    """x, weight and bias shaped as torch's F.conv1d / conv3d / conv_transpose2d take them give the output shape
    shapes() states (on the meta device: nothing is computed)."""
    torch = pytest.importorskip("torch")
    s, d = cases.shapes(case), case.dims
    meta = {name: torch.empty(s[name], device="meta") for name in ("x", "w", "b")}
    y = getattr(torch.nn.functional, case.op)(meta["x"], meta["w"], meta["b"], stride=d.get("s", 1), padding=d["p"],
                                              groups=d.get("g", 1))
    assert tuple(y.shape) == s["y"]


def test_roofline_arithmetic():
    by_label = {c.label: c for c in cases.ND_CASES}
    c3d = by_label["c3d-mri-gpu32"]
    taps, voxels = 27, 32 * 64 * 64
    assert cases.flops(c3d) == 2 * 2 * voxels * 64 * 64 * taps
    assert cases.flops(c3d, backward=True) == 3 * cases.flops(c3d)
    tensors = 2 * 64 * voxels * 2 + 64 * 64 * taps + 64           # x and y, weight, bias
    assert cases.floor_bytes(c3d) == 4 * tensors
    assert cases.floor_bytes(c3d, backward=True) == 2 * 4 * tensors
    k2 = by_label["ct2d-k2s2-gpu16"]                                  # every output pixel gets exactly one tap
    assert cases.flops(k2) == 2 * 8 * 56 * 56 * 128 * 256
    r = cases.roofline(k2, False, None, 989e12, 4.8e12)              # H200 datasheet: memory-bound at fp16
    assert r["floor_bound"] == "memory" and r["floor_ms"] == pytest.approx(cases.floor_bytes(k2) / 4.8e12 * 1e3)


@pytest.mark.slow
def test_smoke_runs_the_nd_cases_on_the_cpu(tmp_path):
    """`--device cpu --smoke --cases issue13` runs the fp16 cases of SMOKE_ON_CPU on tiny shapes through cupyconv's
    NumPy path and torch CPU, forward and forward + backward, every contender agreeing with the baseline."""
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "benchmarks.run", "--device", "cpu", "--smoke", "--cases",
                             "issue13", "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-3000:]}"
    results = json.loads(out.read_text())["results"]
    ran = {(r["op"], r["pass"]) for r in results}
    assert ran == {(op, p) for op in cases.ND_OPS for p in ("fwd", "fwd+bwd")}
    for r in results:
        assert all(e["status"] == "ok" for e in r["contenders"].values()), (r["case"], r["contenders"])
        assert "cupyconv" in r["contenders"] and r["roofline"]["flops"] > 0
