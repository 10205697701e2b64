"""'auto''s strict-fp32 choice between the FMA implicit GEMM and im2col + cuBLAS, held to the performance model.

benchmarks/results/auto-fp32-h100.json is `python -m benchmarks.auto_check`'s record: for each pass 'auto'
decides on the strict-fp32 benchmark cases, the path it took and the path it did not, both PREDICTED for an H100
(benchmarks.predict, emulator counters).  A predicted regression fails here like a wrong result: the path not
taken may not be predicted faster by more than the margin, and the record must describe today's rule (the choices
are recomputed from the cases' real GPU path on a recording device, nothing executed), so a change of the rule,
the tiles or the kernels is followed by a new record (`python -m benchmarks.auto_check --json <record>`).
"""
import json

import pytest

from benchmarks import auto_check
from benchmarks import cases as cases_mod
from benchmarks import launches

RECORD = json.loads(auto_check.RECORD.read_text())


def _label(entry):
    return f"{entry['case']} {entry['pass']} {entry['decides']}"


@pytest.mark.parametrize("entry", RECORD["entries"], ids=_label)
def test_the_path_auto_takes_is_not_predicted_slower(entry):
    ratio = entry["other_over_auto"]
    assert ratio * RECORD["margin"] >= 1, (
        f"{_label(entry)}: 'auto' takes {entry['auto']} ({entry['auto_us']} us predicted) but the other path is "
        f"predicted at {entry['other_us']} us, {1 / ratio:.2f}x faster")


def test_the_record_describes_todays_rule():
    recorded = {(e["case"], e["pass"], e["decides"]): e["auto"] for e in RECORD["entries"]}
    now = {}
    for case in auto_check.strict_fp32_cases():
        for backward in (False, True):
            for pass_, fma in auto_check.auto_choices(case, backward).items():
                now[(case.label, "fwd+bwd" if backward else "fwd", pass_)] = "fma_gemm" if fma else "im2col_gemm"
    assert now == recorded, "regenerate: python -m benchmarks.auto_check --json benchmarks/results/auto-fp32-h100.json"


def test_a_flipped_choice_is_another_path():
    """The instrument can fail: flipping r50-64's forward choice changes the kernels the case launches."""
    case = cases_mod.select(["r50-64-gpu32"], ("gpu",))[0]
    with auto_check.choices():
        taken = [launches.describe(step) for step in launches.record(case, False).steps]
    with auto_check.choices(flip="forward"):
        other = [launches.describe(step) for step in launches.record(case, False).steps]
    assert taken != other
