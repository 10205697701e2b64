"""Markdown tables from benchmark JSON files, for RESULTS.md.

    python -m benchmarks.report bench.json [more.json ...]
    python -m benchmarks.report --plot bench.json       # also writes bench.png beside it (benchmarks/plot.py)

Where the run measured a GEMM peak and copy bandwidth (GPU runs), each row also has the achieved TFLOP/s and the
fraction of that peak (cupyconv, the baseline and every other alternative), the case's GFLOP and floor MB, and
its floor time max(FLOPs / peak, bytes / bandwidth) with what bounds it (com: compute, mem: memory) and cupyconv's
time as a multiple of it.  "ratio" is always against the baseline; the target column names the alternative the
target was checked against where that is the fastest one rather than the baseline.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import plot
from .cases import AUTOTUNE


def _fmt_ms(entry: dict) -> str:
    if "median_ms" not in entry:
        return entry.get("status", "?")
    ms = entry["median_ms"]
    return f"{ms:.2f} ({entry['iqr_pct']:.0f}%)" if ms >= 1 else f"{ms:.4f} ({entry['iqr_pct']:.0f}%)"


def _fmt_roof(entry: dict) -> str:
    """Achieved TFLOP/s and the fraction of the same run's GEMM peak of one contender ("" in older JSON)."""
    r = entry.get("roofline") or {}
    if r.get("tflops") is None:
        return ""
    text = f"{r['tflops']:.1f}" if r["tflops"] >= 1 else f"{r['tflops']:.3f}"
    if r.get("peak_fraction") is not None:
        text += f" ({100 * r['peak_fraction']:.0f}%)"
    return text


def _fmt_floor(res: dict) -> str:
    """The case's floor max(FLOPs / GEMM peak, bytes / copy bandwidth), what bounds it, and cupyconv's multiple."""
    r = res.get("roofline") or {}
    if r.get("floor_ms") is None:
        return ""
    ours = (res["contenders"].get("cupyconv", {}).get("roofline") or {}).get("x_floor")
    return f"{r['floor_ms'] * 1e3:.1f} ({r['floor_bound'][:3]})" + (f", {ours:.1f}x" if ours is not None else "")


def _fmt_work(res: dict) -> str:
    r = res.get("roofline") or {}
    return f"{r['flops'] / 1e9:.2f} / {r['bytes'] / 1e6:.1f}" if r else ""


def _fmt_target(res: dict) -> str:
    parts = []
    t = res.get("target_check")
    if t:
        vs = f" vs {t['vs']}" if t.get("rule") == "best" else ""
        parts.append(f"<= {t['target']:g}x{vs}: {'met' if t['met'] else '**missed**'} ({t['ratio']:.2f}x)"
                     if vs else f"<= {t['target']:g}x: {'met' if t['met'] else '**missed**'}")
    p = res.get("peak_check")
    if p:
        parts.append(f">= {100 * p['target']:g}% of peak: {'met' if p['met'] else '**missed**'}")
    return "; ".join(parts)


def _peaks_line(meta: dict) -> str:
    peaks = meta.get("peaks")
    if not peaks:
        return ""
    gemm = ", ".join(f"{k} {v['tflops']:.1f} TFLOP/s" for k, v in peaks.get("gemm", {}).items())
    copy = peaks.get("copy")
    return (f"Measured in the same process ({peaks.get('method')}): GEMM {gemm}"
            + (f"; copy {copy['gbs']:.0f} GB/s (read + write)" if copy else "") + "  ")


def load(path: Path) -> dict:
    """The results of one `benchmarks.run --json` file; ValueError saying what is wrong with it otherwise."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:   # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not (isinstance(data, dict) and isinstance(data.get("meta"), dict) and isinstance(data.get("results"), list)):
        raise ValueError(f"{path}: not the JSON of `python -m benchmarks.run --json` (no 'meta' and 'results')")
    return data


def report(path: Path, data: dict) -> str:
    meta = data["meta"]
    lines = [
        f"**{path.name}**: `{meta['command']}`, {meta['date']}, mode {data['mode']}  ",
        f"{meta['cpu_model']}, {meta['cpus_usable']} CPUs"
        + (f", GPU {meta['gpu']['name']}" if meta.get("gpu") else "")
        + f"; python {meta['python']}, numpy {meta['numpy']} ({meta.get('numpy_blas')}), torch {meta['torch']}"
        f" ({meta.get('torch_threads')} threads), cupy {meta['cupy']}, cupyconv {meta['cupyconv']}"
        f" ({meta.get('git_commit')}); other processes used {meta.get('others_cpu_pct')}% of the CPUs"
        " during the run",
    ]
    peaks = _peaks_line(meta)
    if peaks:
        lines.append(peaks)
    timing = next((res["timing"] for res in data["results"] if res.get("timing")), None)
    latency = any(res.get("device") == "gpu" and res.get("timing") for res in data["results"])
    if timing:   # what "ms" means (benchmarks/timing.py TIMING); older JSON has no such entry
        lines.append(f"ms: {timing['median_ms']}" + (f"; latency: {timing['latency_median_ms']}" if latency else "")
                     + "  ")
    roofline = any(res.get("roofline") for res in data["results"])
    head = "| case | pass | cupyconv ms (IQR) |" + (" cupyconv latency ms |" if latency else "")
    rule = "| --- | --- | --- |" + (" --- |" if latency else "")
    if roofline:
        head += " cupyconv TFLOP/s (% peak) | GFLOP / floor MB | floor us (bound), cupyconv x floor |"
        rule += " --- | --- | --- |"
    head += " baseline | baseline ms (IQR) | ratio | per-round ratio | target |"
    rule += " --- | --- | --- | --- | --- |"
    if roofline:
        head += " baseline TFLOP/s (% peak) |"
        rule += " --- |"
    tf32_column = any(res.get("tf32") for res in data["results"])
    head += " other alternative: ms (IQR), ratio |" + (" TF32 |" if tf32_column else "") + " others' CPU |"
    rule += " --- |" + (" --- |" if tf32_column else "") + " --- |"
    lines += ["", head, rule]
    for res in data["results"]:
        ours = res["contenders"].get("cupyconv", {})
        base = res["contenders"].get(res["baseline"], {})
        ratio = res["ratios"].get("cupyconv", {}).get(res["baseline"])
        others = []
        for name, entry in res["contenders"].items():
            if (entry.get("ours") and name != AUTOTUNE) or name == res["baseline"]:
                continue   # (cupyconv with autotuning on is listed among the others, without a ratio)
            r = res["ratios"].get("cupyconv", {}).get(name)
            roof = _fmt_roof(entry)
            others.append(f"{name}: {_fmt_ms(entry)}" + (f", {r['ratio_of_medians']:.2f}x" if r else "")
                          + (f", {roof} TFLOP/s" if roof else ""))
        tf32 = res.get("tf32")
        tf32 = ("on" if all(tf32.values()) else "off" if not any(tf32.values()) else "mixed: " + ", ".join(
            k for k, v in tf32.items() if v)) if tf32 and res.get("dtype") == "float32" else ""
        row = f"| ({res['case']}) {res['op']} | {res['pass']} | {_fmt_ms(ours)} |"
        if latency:
            row += f" {ours['latency_median_ms']:.4f} |" if "latency_median_ms" in ours else " |"
        if roofline:
            row += f" {_fmt_roof(ours)} | {_fmt_work(res)} | {_fmt_floor(res)} |"
        row += (f" {res['baseline']} | {_fmt_ms(base)} | "
                + (f"{ratio['ratio_of_medians']:.2f}x | {ratio['median_round_ratio']:.2f}x |" if ratio else " | |")
                + f" {_fmt_target(res)} |")
        if roofline:
            row += f" {_fmt_roof(base)} |"
        row += f" {'; '.join(others)} |" + (f" {tf32} |" if tf32_column else "") + f" {res.get('others_cpu_pct')}% |"
        lines.append(row)
    seen = {}
    for res in data["results"]:
        seen.setdefault(res["case"], res["name"])
    lines.append("")
    lines.extend(f"({label}): {name}  " for label, name in seen.items())
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", type=Path, help="JSON written by `python -m benchmarks.run --json`")
    parser.add_argument("--plot", action="store_true",
                        help="also write each file's plot beside it (bench.json -> bench.png; needs matplotlib, the "
                             "`plot` extra)")
    args = parser.parse_args(argv)
    try:   # every file is read before anything is printed, so a bad one costs no half-written output
        loaded = [(path, load(path)) for path in args.json]
    except ValueError as e:
        parser.error(str(e))
    print("\n\n".join(report(path, data) for path, data in loaded))
    if args.plot:
        try:
            for path, data in loaded:   # stdout is the Markdown; where the plots went goes to stderr
                print(f"wrote {plot.draw(data, plot.png_path(path))}", file=sys.stderr)
        except plot.MatplotlibMissing as e:
            parser.exit(1, f"{parser.prog}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
