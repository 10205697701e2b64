"""Markdown tables from benchmark JSON files, for RESULTS.md.

    python -m benchmarks.report bench.json [more.json ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _fmt_ms(entry: dict) -> str:
    if "median_ms" not in entry:
        return entry.get("status", "?")
    return f"{entry['median_ms']:.2f} ({entry['iqr_pct']:.0f}%)"


def report(path: Path) -> str:
    data = json.loads(path.read_text())
    meta = data["meta"]
    lines = [
        f"**{path.name}**: `{meta['command']}`, {meta['date']}, mode {data['mode']}  ",
        f"{meta['cpu_model']}, {meta['cpus_usable']} CPUs"
        + (f", GPU {meta['gpu']['name']}" if meta.get("gpu") else "")
        + f"; python {meta['python']}, numpy {meta['numpy']} ({meta.get('numpy_blas')}), torch {meta['torch']}"
        f" ({meta.get('torch_threads')} threads), cupy {meta['cupy']}, cupyconv {meta['cupyconv']}"
        f" ({meta.get('git_commit')}); other processes used {meta.get('others_cpu_pct')}% of the CPUs"
        " during the run",
        "",
        "| case | pass | cupyconv ms (IQR) | baseline | baseline ms (IQR) | ratio | per-round ratio | target |"
        " other alternative: ms (IQR), ratio | others' CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for res in data["results"]:
        ours = res["contenders"].get("cupyconv", {})
        base = res["contenders"].get(res["baseline"], {})
        ratio = res["ratios"].get("cupyconv", {}).get(res["baseline"])
        t = res.get("target_check")
        target = f"<= {t['target']:g}x: {'met' if t['met'] else '**missed**'}" if t else ""
        others = []
        for name, entry in res["contenders"].items():
            if entry.get("ours") or name == res["baseline"]:
                continue
            r = res["ratios"].get("cupyconv", {}).get(name)
            others.append(f"{name}: {_fmt_ms(entry)}" + (f", {r['ratio_of_medians']:.2f}x" if r else ""))
        lines.append(
            f"| ({res['case']}) {res['op']} | {res['pass']} | {_fmt_ms(ours)} | {res['baseline']} | "
            f"{_fmt_ms(base)} | {ratio['ratio_of_medians']:.2f}x | {ratio['median_round_ratio']:.2f}x | {target} | "
            f"{'; '.join(others)} | {res.get('others_cpu_pct')}% |" if ratio else
            f"| ({res['case']}) {res['op']} | {res['pass']} | {_fmt_ms(ours)} | {res['baseline']} | "
            f"{_fmt_ms(base)} | | | {target} | {'; '.join(others)} | {res.get('others_cpu_pct')}% |")
    seen = {}
    for res in data["results"]:
        seen.setdefault(res["case"], res["name"])
    lines.append("")
    lines.extend(f"({label}): {name}  " for label, name in seen.items())
    return "\n".join(lines)


def main(argv=None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("\n\n".join(report(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
