"""Host time per repeated call, before and after a change, on this CPU: two source trees timed in turns.

    python -m benchmarks.host_ab --base <git revision> [--cases r50-64-gpu16,iv-gpu16] [--calls 2000] [--rounds 5]

`benchmarks.host_overhead`'s best-of-three wall clock swings by 2x on a CPU shared with other jobs, so that one
run before and one after cannot show a change of 10%.  This tool exports the base revision (`git archive`) next
to the working tree and, in each round, runs every case-pass of both trees in fresh processes, one tree after the
other (the order alternating), each call timed alone on NullGpu (`host_overhead.build`: CuPy arrays, no GPU) after
a warm-up, the cyclic collector off; a process reports each case-pass's median per call, and the table gives the
least and the median over rounds of those, with the counts of `host_overhead.counts` (calls, launches,
allocations) of each tree.  The figures are this CPU's, with no real CuPy launch or pool
allocation under them: a trend for the GPU host's, not its value (`benchmarks.predict`'s host model gives that).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = "r50-64-gpu16,p-seed-gpu16,iii-gpu32,iv-gpu16"

# Run in a fresh process with the tree's root first on sys.path: the median us per call and the counts of each
# case-pass, as JSON on the last line.
_CHILD = """
import gc, json, statistics, sys, time
from benchmarks import cases, host_overhead
out = {}
for label in sys.argv[1].split(","):
    for backward in (False, True):
        case = cases.select([label], ("gpu",))[0]
        device, fn = host_overhead.build(case, backward)
        with host_overhead.on_null_gpu(device, case):
            for _ in range(20):
                fn()
            gc.collect()
            gc.disable()
            times = []
            for _ in range(int(sys.argv[2])):
                begin = time.perf_counter_ns()
                fn()
                times.append(time.perf_counter_ns() - begin)
            gc.enable()
        name = f"{label} {'fwd+bwd' if backward else 'fwd'}"
        out[name] = {"us": statistics.median(times) / 1e3, **host_overhead.counts(case, backward)}
print(json.dumps(out))
"""


def run_tree(tree: Path, cases: str, calls: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _CHILD, cases, str(calls)], cwd=tree, env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_ab", description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision of the 'before' tree (e.g. main)")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated GPU case labels")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per case-pass and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="host_ab_") as temp:
        base = Path(temp)
        archive = subprocess.run(["git", "archive", args.base], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        rounds: dict = {"base": [], "head": []}
        for turn in range(args.rounds):   # the order alternates: a trend in the load falls on both alike
            for name, tree in (("base", base), ("head", ROOT))[::1 if turn % 2 == 0 else -1]:
                rounds[name].append(run_tree(tree, args.cases, args.calls))
    print(f"base {args.base} -> head (working tree): each round's median of {args.calls} calls, the least over "
          f"{args.rounds} rounds (other jobs only add time) and their median (us per call, this CPU, NullGpu)\n")
    print("| case-pass | least of the rounds | change | median of the rounds | change | calls | launches | "
          "allocations |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in rounds["base"][0]:
        least = [min(r[key]["us"] for r in rounds[name]) for name in ("base", "head")]
        middle = [statistics.median(r[key]["us"] for r in rounds[name]) for name in ("base", "head")]
        b, h = rounds["base"][0][key], rounds["head"][0][key]
        print(f"| {key} | {least[0]:.1f} -> {least[1]:.1f} | {(least[1] / least[0] - 1) * 100:+.0f}% | "
              f"{middle[0]:.1f} -> {middle[1]:.1f} | {(middle[1] / middle[0] - 1) * 100:+.0f}% | {b['calls']:g} -> "
              f"{h['calls']:g} | {b['launches']:g} -> {h['launches']:g} | {b['allocations']:g} -> "
              f"{h['allocations']:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
