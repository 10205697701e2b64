"""Emulated memory counters of a benchmark case: `python -m emulator --case r50-64-gpu16` (with tests/ and the
repository root on PYTHONPATH).

Runs the case's cupyconv calls (benchmarks/cases.py, the forward, and with --backward the gradients too) through
the GPU path on EmulatedDevice(counters=True), every launch on a sample of blocks, and prints each launch's
counters per access site (emulator counts of the access pattern, not GPU measurements).  --batch replaces the
case's N (the grid, and so the planner's choices, depend on it; the sampled blocks keep the run short)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from . import EmulatedDevice, profile_report, spread_blocks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True, help="a case label of benchmarks/cases.py")
    parser.add_argument("--batch", type=int, help="N instead of the case's")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per launch, spread over the grid (default 4)")
    parser.add_argument("--backward", action="store_true", help="the backward pass too (the gradients)")
    parser.add_argument("--json", metavar="FILE", help="write the LaunchProfiles as JSON")
    args = parser.parse_args(argv)

    import dataclasses
    from benchmarks import cases
    from cupyconv import _device, settings

    found = [c for c in cases.ALL_CASES if c.label == args.case]
    if not found:
        parser.error(f"--case: {args.case!r} is not a case of benchmarks/cases.py")
    case = found[0]
    if args.batch:
        case = dataclasses.replace(case, dims={**case.dims, "N": args.batch})
    d = case.dims
    run = cases._cupyconv_call(case, cases.make_inputs(case), args.backward)  # what the benchmark times
    device = EmulatedDevice(counters=True, blocks=spread_blocks(args.blocks))
    start = time.time()
    with _device.use_device(device), settings.allow_tf32(case.tf32):
        run()
    print(f"{case.label} ({case.name}), N = {d['N']}, {args.blocks} blocks per launch, emulated in "
          f"{time.time() - start:.0f} s: emulator counts, not GPU measurements")
    print(profile_report(device.profile))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": case.label, "dims": d, "profiles": [p.to_dict() for p in device.profile]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
