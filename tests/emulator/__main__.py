"""Emulated memory counters of a conv2d benchmark case: `python -m emulator --case r50-64-gpu16` (with tests/ and
the repository root on PYTHONPATH).

Runs the case's forward (and with --backward its gradients) through cupyconv's GPU path on
EmulatedDevice(counters=True), every launch on a sample of blocks, and prints each launch's counters per access
site (emulator counts of the access pattern, not GPU measurements).  --batch replaces the case's N (the grid,
and so the planner's tile choice, depend on it; the sampled blocks keep the run short either way)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from . import EmulatedDevice, profile_report, spread_blocks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True, help="a conv2d GPU case label of benchmarks/cases.py")
    parser.add_argument("--batch", type=int, help="N instead of the case's")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per launch, spread over the grid (default 4)")
    parser.add_argument("--backward", action="store_true", help="also the input and weight gradients")
    parser.add_argument("--algorithm", default="auto", help="cupyconv's algorithm= (default auto, as planned "
                                                            "for a GPU)")
    parser.add_argument("--json", metavar="FILE", help="write the LaunchProfiles as JSON")
    args = parser.parse_args(argv)

    import dataclasses
    import cupyconv
    from benchmarks import cases
    from cupyconv import _device, settings

    found = [c for c in cases.ALL_CASES if c.label == args.case]
    if not found or found[0].op != "conv2d":
        parser.error(f"--case: {args.case!r} is not a conv2d case of benchmarks/cases.py")
    case = found[0]
    if args.batch:
        case = dataclasses.replace(case, dims={**case.dims, "N": args.batch})
    inputs = cases.make_inputs(case)
    d = case.dims
    kwargs = dict(stride=d.get("s", 1), padding=d["p"], groups=d.get("g", 1), algorithm=args.algorithm)
    device = EmulatedDevice(counters=True, blocks=spread_blocks(args.blocks))
    start = time.time()
    with _device.use_device(device), settings.allow_tf32(case.tf32):
        cupyconv.conv2d(inputs["x"], inputs["w"], inputs["b"], **kwargs)
        if args.backward:
            cupyconv.conv2d_backward(inputs["gy"], inputs["x"], inputs["w"], **kwargs)
    print(f"{case.label} ({case.name}), N = {d['N']}, {args.blocks} blocks per launch, emulated in "
          f"{time.time() - start:.0f} s: emulator counts, not GPU measurements")
    print(profile_report(device.profile))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": case.label, "dims": d, "profiles": [p.to_dict() for p in device.profile]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
