"""The performance model against measured kernel times: each kernel of a host profile next to its prediction.

    python -m benchmarks.calibrate benchmarks/results/gpu-2026-11-26/host-profile/autotune-off.json \\
        [more profiles] [--predictions benchmarks/results/predict-h200.json ...] [--json OUT.json]
    python -m benchmarks.calibrate off.json on.json=auto.json,autotuned.json   # a profile's own predictions

Several predictions files are merged, a later one's case-pass replacing an earlier one's: e.g. the 'auto' plans
of every case, then those an autotuned run chose instead (`python -m benchmarks.predict --choices ...`).

A profile (`benchmarks.host_profile`'s JSON; `benchmarks.gpu_check`'s run.json carries one under "profile") gives,
per case-pass ("r50-64-gpu16-fwdbwd"), the GPU kernels one call launched, from torch.profiler's CUPTI trace:
{kernel name: [launches per call, GPU us per call]}, launches of one name summed, names in the order first seen.
The predictions (`python -m benchmarks.predict --json`) list, per case and pass, every launch the model expects in
launch order (`results[i].kernels[j]`: name, bound, predicted_us).

Matching, per case-pass: each measured name is reduced to its base (`kernel_base`: "void depthwise_fwd<float, int,
3, 1, false, true>(float const*, ..." -> "depthwise_fwd"; CuPy's elementwise kernels "cupy_copy__float32_float32"
-> "CuPy copy", the model's name for array-library work; cuBLAS's "sm80_xmma_gemm_..." / "...gemm..." -> the
model's "cuBLAS gemm"), and takes as many predicted launches of that base as it measured launches, the first ones
not yet taken, in the predictions' order (the template arguments are not compared: the predictions may name fewer,
and CUPTI cuts names at 90 characters).  A measured launch left without a prediction ("unpredicted": the GPU ran
another plan, e.g. an autotuned choice, while the model recorded the 'auto' heuristic's) and a predicted launch
nothing measured ("not measured") are listed too, never silently dropped.

What is compared: the measured GPU time of the matched launches (CUPTI: from the kernel's start on the GPU to its
end) against the sum of their predicted kernel times.  A prediction of record (before the correction of
2026-11-26) adds a launch overhead of 1.5-4 us to each kernel; where a prediction gives "kernel_us" (the kernel
alone, without the launch overhead, which CUPTI does not see), that is compared instead.  Every figure here is a
comparison of MEASURED times (the profile) with PREDICTED ones (the model).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PREDICTIONS = ROOT / "benchmarks" / "results" / "predict-h200.json"

CUPY_KERNEL = re.compile(r"^cupy_([a-z]+)")                         # cupy_copy__float32_float32, cupy_sum_...
CUBLAS_KERNEL = re.compile(r"(^sm\d+_xmma_|gemm|cutlass)", re.IGNORECASE)
PASSES = {"fwd": "fwd", "fwdbwd": "fwd+bwd"}


def kernel_base(name: str) -> str:
    """The name both sides share: a kernel template's name, "CuPy <kind>" or "cuBLAS gemm"."""
    name = name.strip()
    if name.startswith("CuPy "):
        return name
    cupy = CUPY_KERNEL.match(name)
    if cupy:
        return f"CuPy {cupy.group(1)}"
    if name.startswith("cuBLAS") or CUBLAS_KERNEL.search(name) and "<" not in name.split("(")[0]:
        return "cuBLAS gemm"
    if name.startswith("void "):
        name = name[len("void "):]
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()


def split_case_pass(key: str) -> tuple[str, str]:
    """'r50-64-gpu16-fwdbwd' -> ('r50-64-gpu16', 'fwd+bwd')."""
    case, _, suffix = key.rpartition("-")
    if suffix not in PASSES:
        raise ValueError(f"calibrate: profile key {key!r} does not end in -fwd or -fwdbwd")
    return case, PASSES[suffix]


def predicted_kernel_us(kernel: dict) -> tuple[float, float]:
    """A predicted launch's kernel time: "kernel_us" (the kernel alone) where the prediction gives it, else its
    predicted_us (which includes the launch overhead in predictions made before the split)."""
    low, high = kernel.get("kernel_us") or kernel["predicted_us"]
    return float(low), float(high)


def match_case_pass(kernels: dict, predicted: list[dict]) -> list[dict]:
    """Rows for one case-pass: measured {name: [launches, us]} against the predicted launches (in launch order)."""
    by_base: dict[str, list[dict]] = defaultdict(list)
    for kernel in predicted:
        by_base[kernel_base(kernel["name"])].append(kernel)
    rows = []
    for name, (launches, us) in kernels.items():
        base = kernel_base(name)
        count = round(launches)
        taken, by_base[base] = by_base[base][:count], by_base[base][count:]
        row = {"kernel": base, "measured_name": name, "launches": launches, "measured_us": us,
               "predicted_launches": len(taken), "predicted_names": [k["name"] for k in taken]}
        if taken:
            ranges = [predicted_kernel_us(k) for k in taken]
            low, high = sum(r[0] for r in ranges), sum(r[1] for r in ranges)
            row.update(predicted_us=[round(low, 2), round(high, 2)],
                       bound=" | ".join(dict.fromkeys(k["bound"] for k in taken)),
                       one_pass=any(k.get("one_pass") or (k.get("work") or {}).get("one_pass") for k in taken),
                       measured_over_high=round(us / high, 3) if high else None,
                       inside=low <= us <= high if len(taken) == count else None)
        if len(taken) < count:
            row["unpredicted_launches"] = count - len(taken)
        rows.append(row)
    for base, left in by_base.items():
        for kernel in left:
            rows.append({"kernel": base, "measured_name": None, "launches": 0, "measured_us": None,
                         "predicted_launches": 1, "predicted_names": [kernel["name"]],
                         "predicted_us": list(predicted_kernel_us(kernel)), "bound": kernel["bound"],
                         "not_measured": True})
    return rows


def merged(predictions: list[dict]) -> dict:
    """{(case, pass): result} of several predictions files, a later file's case-pass replacing an earlier one's."""
    return {(r["case"], r["pass"]): r for p in predictions for r in p.get("results", [])}


def calibrate(profiles: dict[str, dict], predictions: dict | list[dict],
              own: dict[str, list[dict]] | None = None) -> list[dict]:
    """Rows for every case-pass of every profile ({label: profile JSON}) the predictions have (`own`: {label:
    predictions files} for a profile that has its own)."""
    default = merged(predictions if isinstance(predictions, list) else [predictions])
    rows = []
    for label, profile in profiles.items():
        predicted = merged(own[label]) if own and label in own else default
        for key, record in profile.items():
            case, pass_ = split_case_pass(key)
            base = {"profile": label, "case": case, "pass": pass_}
            if "kernels" not in record:
                rows.append({**base, "error": record.get("error", "no kernels")})
                continue
            p = predicted.get((case, pass_))
            if p is None:
                rows.append({**base, "error": "no prediction for this case-pass"})
                continue
            rows += [{**base, **row} for row in match_case_pass(record["kernels"], p["kernels"])]
    return rows


def bound_class(bound: str) -> str:
    """The first-named (largest) resource of a bound such as 'instruction issue ~ DRAM'."""
    return bound.split(" | ")[0].split(" ~ ")[0]


def summary(rows: list[dict]) -> list[dict]:
    """Per bound class of the matched launches: how many, how many inside, measured / predicted high (geometric
    mean, lowest, highest)."""
    classes: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("measured_over_high") and r.get("inside") is not None:
            classes[bound_class(r["bound"]) + (" (one pass)" if r.get("one_pass") else "")].append(r)
    out = []
    for name, members in sorted(classes.items()):
        ratios = [r["measured_over_high"] for r in members]
        out.append({"bound": name, "rows": len(members), "inside": sum(r["inside"] for r in members),
                    "above": sum(r["measured_us"] > r["predicted_us"][1] for r in members),
                    "below": sum(r["measured_us"] < r["predicted_us"][0] for r in members),
                    "measured_over_high_geomean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
                    "measured_over_high_range": [min(ratios), max(ratios)]})
    return out


def markdown(rows: list[dict], classes: list[dict]) -> str:
    lines = ["| profile | case | pass | kernel | launches | MEASURED us | PREDICTED us | measured / high | "
             "bound (model) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        head = f"| {r['profile']} | {r['case']} | {r['pass']} "
        if "error" in r:
            lines.append(f"{head}| {r['error']} | | | | | |")
            continue
        measured = "-" if r["measured_us"] is None else f"{r['measured_us']:.1f}"
        if "predicted_us" in r:
            lo, hi = r["predicted_us"]
            predicted = f"{lo:.1f}-{hi:.1f}"
            if r.get("unpredicted_launches"):
                predicted += f" ({r['predicted_launches']} of {round(r['launches'])} launches)"
        else:
            predicted = "no prediction (not in the model's plan)"
        ratio = r.get("measured_over_high")
        flag = "" if r.get("inside") in (True, None) else (" **above**" if r["measured_us"] > r["predicted_us"][1]
                                                           else " **below**")
        note = (" (predicted, not measured)" if r.get("not_measured") else
                " (one pass)" if r.get("one_pass") else "")
        lines.append(f"{head}| {r['kernel']}{note} | {r['launches']:g} | {measured} | {predicted} | "
                     f"{'' if ratio is None else f'{ratio:.2f}'}{flag} | {r.get('bound', '')} |")
    lines += ["", "| bound (model, first named) | launches compared | inside | above | below | "
              "measured / high (geomean, range) |", "| --- | --- | --- | --- | --- | --- |"]
    for c in classes:
        lo, hi = c["measured_over_high_range"]
        lines.append(f"| {c['bound']} | {c['rows']} | {c['inside']} | {c['above']} | {c['below']} | "
                     f"{c['measured_over_high_geomean']:.2f} ({lo:.2f}-{hi:.2f}) |")
    return "\n".join(lines)


# The model's check against the H100's MEASURED kernel times (tests/test_calibrate.py): the work of each launch of
# the profiled case-passes (what the SASS and the emulator's counters gave, slow to recount) is recorded once,
# `model_inputs`; `retimed` puts it through the model's rules of today (`predict.timed`), fast, so that a change of
# those rules that loses a measured kernel fails the check.  Re-record the inputs when the kernels change.
H100_RUN = ROOT / "benchmarks" / "results" / "gpu-2026-11-26-h100"
H100_INPUTS = H100_RUN / "model-inputs.json"


def model_inputs(profile: dict, gpu_key: str = "h100") -> dict:
    """{"gpu", "results": [{case, pass, kernels: [recorded inputs]}]} for every case-pass of a host profile: per
    launch its launch (arguments included), occupancy and work before timing; a GEMM or array-library operation
    as predicted (its kernel_us and bound)."""
    from . import cases as cases_mod
    from . import predict
    source = predict.SassSource()
    results = []
    for key in profile:
        label, pass_ = split_case_pass(key)
        case = next(c for c in cases_mod.ALL_CASES if c.label == label)
        kernels: list = []
        predict.predict_case(case, pass_ == "fwd+bwd", gpu_key, source, counters=True, inputs=kernels)
        results.append({"case": label, "pass": pass_, "kernels": kernels})
    return {"gpu": gpu_key, "results": results}


def retimed(inputs: dict) -> dict:
    """Predictions (`calibrate`'s format) of recorded inputs (`model_inputs`) under today's model rules."""
    from types import SimpleNamespace

    from . import launches as launches_mod
    from . import predict
    gpu = predict.GPUS[inputs["gpu"]]
    results = []
    for r in inputs["results"]:
        kernels = []
        for k in r["kernels"]:
            if "work" not in k:   # a GEMM or array-library operation: as recorded
                kernels.append({"name": k["name"], "bound": k["bound"], "kernel_us": k["kernel_us"]})
                continue
            d = k["launch"]
            args = {name: launches_mod.ArrayArg(tuple(v["shape"]), v["dtype"], v["nbytes"], v["read_only"])
                    if isinstance(v, dict) else v for name, v in d["args"].items()}
            launch = launches_mod.Launch(d["source"], d["name"], tuple(d["grid"]), tuple(d["block"]),
                                         d["shared_mem"], args)
            occ = SimpleNamespace(**k["occupancy"]) if k["occupancy"] else None
            model = predict.timed(predict.KernelModel(launch, None, {}, dict(k["work"]), k["occupancy"]), occ, gpu)
            kernels.append({"name": k["name"], "bound": model.bound, "kernel_us": model.kernel_time.to_list(),
                            "work": model.work})
        results.append({"case": r["case"], "pass": r["pass"], "kernels": kernels})
    return {"results": results}


def load_profile(path: Path) -> dict:
    """A host profile JSON, or the "profile" of a gpu_check run.json that carries one."""
    data = json.loads(path.read_text())
    return data.get("profile", data) if isinstance(data, dict) else data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="+", help="benchmarks.host_profile JSON files, each optionally "
                                                    "=PREDICTIONS.json[,MORE.json] (its own predictions)")
    parser.add_argument("--predictions", type=Path, action="append",
                        help="a benchmarks.predict --json file; repeat to merge (default: the H200 predictions of "
                             "record)")
    parser.add_argument("--json", type=Path, help="write {rows, summary} here")
    parser.add_argument("--model-inputs", type=Path, metavar="OUT",
                        help="instead: record the model's inputs of the (one) profile's case-passes into OUT "
                             "(H100; for tests/test_calibrate.py's check, after a kernel change)")
    args = parser.parse_args(argv)
    if args.model_inputs:
        args.model_inputs.write_text(json.dumps(model_inputs(load_profile(Path(args.profiles[0]))), indent=0) + "\n")
        return 0
    read = functools.cache(lambda path: json.loads(Path(path).read_text()))
    default = [read(str(p)) for p in (args.predictions or [DEFAULT_PREDICTIONS])]
    profiles, own = {}, {}
    for item in args.profiles:
        path, _, mine = item.partition("=")
        label = Path(path).stem
        profiles[label] = load_profile(Path(path))
        if mine:
            own[label] = [read(p) for p in mine.split(",")]
    rows = calibrate(profiles, default, own)
    classes = summary(rows)
    used = [p.get("meta", {}) for p in default + [p for files in own.values() for p in files]]
    print(f"MEASURED kernel times ({', '.join(args.profiles)}) against PREDICTED (gpu "
          f"{', '.join(sorted({str(m.get('gpu')) for m in used}))}, model at commit "
          f"{', '.join(sorted({str(m.get('git_commit')) for m in used}))})")
    print(markdown(rows, classes))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": classes}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
