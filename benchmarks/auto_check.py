"""Does 'auto' take the faster strict-fp32 path?  The performance model's answer: PREDICTIONS, not measurements.

    python -m benchmarks.auto_check                                   # every strict-fp32 GPU case, H100
    python -m benchmarks.auto_check --json benchmarks/results/auto-fp32-h100.json   # the record tests read

With TF32 off, 'auto' (`ops/conv.py choose_algorithm`) decides each pass of a convolution -- forward, input
gradient, weight gradient -- between the FMA implicit GEMM and im2col + cuBLAS by `ops.simt_gemm.simt_preferred`.
For every strict-fp32 GPU case whose passes consult that rule, `benchmarks.predict` predicts the case with
'auto''s choices and once more per pass with that one pass's choice flipped (the rule is patched for the run;
every other pass keeps its choice).  The rule is the library's; this is the instrument that checks it, and
tests/test_auto_choice.py fails when the record says the path 'auto' did not take is predicted faster by more
than MARGIN (geometric means of the ranges), or when 'auto' no longer makes the recorded choices.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path
from unittest import mock

from cupyconv.ops import conv as conv_mod
from cupyconv.ops import simt_gemm

from . import cases as cases_mod
from . import launches as launches_mod
from . import predict as predict_mod

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "auto-fp32-h100.json"
MARGIN = 1.05   # the other path may be predicted up to 5% faster: the model cannot rank closer than that
PASSES = {False: ("forward",), True: ("forward", "input", "weight")}


def _mid(time_range) -> float:
    return math.sqrt(time_range[0] * time_range[1])


@contextlib.contextmanager
def choices(flip: str | None = None):
    """Record every (pass, spec) 'auto' asks `simt_preferred` about where the FMA GEMM can run that pass (else
    there is no choice) and the answer, flipping the answer for pass `flip`."""
    asked: dict = {}
    rule = simt_gemm.simt_preferred

    def patched(spec, dtype, pass_="forward"):
        answer, runs = rule(spec, dtype, pass_), simt_gemm.simt_runs(spec, dtype, pass_)
        if pass_ == flip and runs:
            answer = not answer
        if runs:
            asked[(pass_, spec)] = answer
        return answer

    with mock.patch.object(conv_mod, "simt_preferred", patched):
        yield asked


def auto_choices(case: cases_mod.Case, backward: bool) -> dict[str, bool]:
    """{pass: whether 'auto' runs it on the FMA GEMM} for the passes of the case that consult the rule (a pass
    asked about several specs, e.g. 3-D slabs of different depths, is recorded by its first answer)."""
    with choices() as asked:
        launches_mod.record(case, backward)
    return {pass_: answer for (pass_, _), answer in reversed(list(asked.items()))}


def check_case(case: cases_mod.Case, backward: bool, sass_source) -> list[dict]:
    """One entry per pass of the case that 'auto' decides: its choice, both predictions, and the verdict."""
    chosen = auto_choices(case, backward)
    if not chosen:
        return []
    auto = predict_mod.predict_case(case, backward, "h100", sass_source, True)
    entries = []
    for pass_ in PASSES[backward]:
        if pass_ not in chosen:
            continue
        with choices(flip=pass_):
            other = predict_mod.predict_case(case, backward, "h100", sass_source, True)
        entries.append({"case": case.label, "pass": auto["pass"], "decides": pass_,
                        "auto": "fma_gemm" if chosen[pass_] else "im2col_gemm",
                        "auto_us": auto["predicted_us"], "other_us": other["predicted_us"],
                        "other_over_auto": round(_mid(other["predicted_us"]) / _mid(auto["predicted_us"]), 3)})
    return entries


def strict_fp32_cases() -> list[cases_mod.Case]:
    return [c for c in cases_mod.select([], ("gpu",)) if c.dtype == "float32" and not c.tf32]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.auto_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated labels (default: every strict-fp32 GPU case)")
    parser.add_argument("--json", type=Path, help=f"write the record here (tests read {RECORD.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
    cases = [c for c in strict_fp32_cases() if not wanted or c.label in wanted]
    sass_source = predict_mod.SassSource(enabled=True)
    entries = [e for case in cases for backward in (False, True) for e in check_case(case, backward, sass_source)]
    print("PREDICTION (no GPU measurement), H100 model: each pass 'auto' decides for strict fp32, and the path it "
          "did not take")
    print(f"{'case':18s} {'pass':8s} {'decides':8s} {'auto takes':12s} {'auto us':>16s} {'other us':>16s}  other/auto")
    for e in entries:
        flag = "" if e["other_over_auto"] * MARGIN >= 1 else "   <- other predicted faster"
        print(f"{e['case']:18s} {e['pass']:8s} {e['decides']:8s} {e['auto']:12s} "
              f"{e['auto_us'][0]:7.1f}-{e['auto_us'][1]:8.1f} {e['other_us'][0]:7.1f}-{e['other_us'][1]:8.1f}  "
              f"{e['other_over_auto']:.2f}{flag}")
    if args.json:
        meta = predict_mod.meta("h100", True, sass_source, predict_mod.COUNTER_BUDGET)
        args.json.write_text(json.dumps({"meta": meta, "margin": MARGIN, "entries": entries}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
