"""A plot of one benchmark run, written beside its JSON (bench.json -> bench.png).

    python -m benchmarks.run --json bench.json         # writes bench.png too, at the end of the run
    python -m benchmarks.report --plot bench.json      # draws it for a JSON written earlier

One row per case, grouped by op and tag (issue11, issue13), one panel per pass: cupyconv's time / each
alternative's time measured in the same run, on a log scale with the 1.0 line (left of it: cupyconv is faster) and
the case's target where it has one.  Where the run measured the roofline (GPU runs, and CPU smoke runs), a last
panel shows cupyconv's fraction of the floor: floor time / cupyconv's time, 1 at the floor.  The title gives the
device, the versions and the date.

matplotlib is optional (the `plot` extra) and imported only when a plot is drawn; the figure is rendered by the Agg
canvas, so no display is needed and pyplot's global state is never touched.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

PASSES = {"fwd": "forward", "fwd+bwd": "forward + backward"}
FLOOR_MARKERS = {"fwd": "o", "fwd+bwd": "^"}
MARKERS = "osD^vP<>Xh*p"
ROW_INCHES = 0.2      # one row of 8-point labels, readable at 60 cases and more
PANEL_INCHES = 4.2
PNG_COLOURS = 128


class MatplotlibMissing(RuntimeError):
    """No plot: matplotlib is not installed."""


@dataclass
class Row:
    """One case: per pass, cupyconv's time / each alternative's, the target ratio, and the fraction of the floor."""
    label: str
    ratios: dict = field(default_factory=dict)        # pass -> {alternative: ratio}; {} when none could be taken
    targets: dict = field(default_factory=dict)       # pass -> (target ratio, the alternative it is against)
    floor_fraction: dict = field(default_factory=dict)   # pass -> floor time / cupyconv's time


def png_path(json_path: Path) -> Path:
    return json_path.with_suffix(".png")


def group_name(res: dict) -> str:
    """The op, and the case's tags where it has any ("conv2d issue11"); JSON from before tags were recorded has
    none."""
    return " ".join([res["op"], *res.get("tags", ())])


def rows(data: dict) -> list[tuple[str, list[Row]]]:
    """The run's results as (group, rows) in the order each group and case first ran."""
    groups: dict[str, dict[str, Row]] = {}
    for res in data["results"]:
        row = groups.setdefault(group_name(res), {}).setdefault(res["case"], Row(res["case"]))
        row.ratios[res["pass"]] = {name: r["ratio_of_medians"] for name, r in res["ratios"].get("cupyconv", {}).items()
                                   if _positive(r["ratio_of_medians"])}
        if _positive(res.get("target")):   # against the baseline, or the fastest alternative (target_check's vs)
            row.targets[res["pass"]] = (res["target"], (res.get("target_check") or {}).get("vs", res["baseline"]))
        floor_ms = (res.get("roofline") or {}).get("floor_ms")
        ours_ms = res["contenders"].get("cupyconv", {}).get("median_ms")
        if _positive(floor_ms) and _positive(ours_ms):
            row.floor_fraction[res["pass"]] = floor_ms / ours_ms
    return [(name, list(by_case.values())) for name, by_case in groups.items()]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def title(data: dict) -> str:
    meta = data["meta"]
    gpu = meta.get("gpu")
    device = (f"GPU {gpu['name']} (CUDA {gpu.get('torch_cuda')}, cuDNN {gpu.get('cudnn')})" if gpu else
              f"CPU only: {meta.get('cpu_model')}, {meta.get('cpus_usable')} usable CPUs")
    versions = (f"cupyconv {meta.get('cupyconv')} ({meta.get('git_commit')}), torch {meta.get('torch')}, "
                f"CuPy {meta.get('cupy')}, NumPy {meta.get('numpy')}, Python {meta.get('python')}")
    run = (f"{meta.get('date')}, mode {data.get('mode')}" + ("" if data.get("complete", True) else ", cut short")
           + f"; other processes used {meta.get('others_cpu_pct')}% of the CPUs")
    return f"cupyconv time / alternative time, same run\n{device}\n{versions}\n{run}"


def _figure_class():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MatplotlibMissing('no plot: matplotlib is not installed; pip install -e ".[plot]" (the plot extra) '
                                "or pip install matplotlib") from None
    return Figure, FigureCanvasAgg


def _log_limits(values) -> tuple[float, float]:
    """x limits of a log axis holding the values and 1.0, with a margin."""
    values = [v for v in values if _positive(v)] + [1.0]
    return min(values) / 1.6, max(values) * 1.6


def draw(data: dict, out: Path) -> Path:
    """Writes the plot of one run's results (report.load's dict) to out as a PNG; returns out."""
    Figure, FigureCanvasAgg = _figure_class()
    from matplotlib.ticker import LogLocator, NullFormatter

    groups = rows(data)
    passes = [p for p in PASSES if any(p in row.ratios for _, group in groups for row in group)]
    floors = any(row.floor_fraction for _, group in groups for row in group)
    labels, headings, placed = _layout(groups)
    alternatives = list(dict.fromkeys(name for _, row in placed for ratios in row.ratios.values() for name in ratios))

    panels = max(len(passes) + floors, 1)
    legend_lines = math.ceil((len(alternatives) + 3) / 3)
    fig = Figure(figsize=(1.8 + PANEL_INCHES * panels, 1.6 + 0.2 * legend_lines + ROW_INCHES * len(labels)),
                 layout="constrained", dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, sharey=True, squeeze=False)[0]
    fig.suptitle(title(data), fontsize=9, x=0.01, horizontalalignment="left")
    limits = _log_limits([v for _, row in placed for p in passes for v in [*row.ratios.get(p, {}).values(),
                                                                           row.targets.get(p, (None,))[0]]])
    for ax, pass_ in zip(axes, passes):
        _ratio_panel(ax, pass_, placed, alternatives, limits)
    if floors:
        _floor_panel(axes[len(passes)], placed)
    if not placed:
        axes[0].text(0.5, 0.5, "no case was measured", transform=axes[0].transAxes, horizontalalignment="center")
    for ax in axes:
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))   # 0.5x, 1x, 2x, 5x: values read off directly
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", which="major", color="0.9")
        ax.axvline(1.0, color="black", linewidth=0.8, zorder=2)
        ax.set_ylim(max(len(labels), 1) - 0.5, -0.5)   # first case at the top
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        for y in headings:
            ax.axhline(y, color="0.75", linewidth=0.8)
    for y in headings:
        axes[0].get_yticklabels()[y].set_fontweight("bold")
    legend = {}   # label -> handle, once: the panels of both passes have the same alternatives
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(name, handle)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    _save(fig, out)
    return out


def _layout(groups) -> tuple[list[str], list[int], list[tuple[int, Row]]]:
    """The y labels top down (a heading per group, then its cases), the headings' positions, and each row's."""
    labels, headings, placed = [], [], []
    for name, group in groups:
        headings.append(len(labels))
        labels.append(name)
        for row in group:
            placed.append((len(labels), row))
            labels.append(row.label)
    return labels, headings, placed


def _ratio_panel(ax, pass_: str, placed, alternatives: list[str], limits: tuple[float, float]) -> None:
    """cupyconv's time / each alternative's (a colour and marker per alternative), and the targets, each in the
    colour of the alternative it is against."""
    from matplotlib.ticker import FuncFormatter
    colours = {name: f"C{i % 10}" for i, name in enumerate(alternatives)}
    for i, name in enumerate(alternatives):
        points = [(row.ratios[pass_][name], y) for y, row in placed if name in row.ratios.get(pass_, {})]
        ax.scatter([x for x, _ in points], [y for _, y in points], s=22, color=colours[name],
                   marker=MARKERS[i % len(MARKERS)], label=name, zorder=3)
    targets = [(*row.targets[pass_], y) for y, row in placed if pass_ in row.targets]
    ax.scatter([x for x, _, _ in targets], [y for _, _, y in targets], s=120, marker="|", linewidths=2, zorder=2,
               color=[colours.get(vs, "black") for _, vs, _ in targets])
    ax.scatter([], [], s=120, marker="|", linewidths=2, color="black",   # the legend's entry, in neutral black
               label="target: at most this (colour: the alternative it is against)")
    for y, row in placed:
        if row.ratios.get(pass_) == {}:   # measured, but no ratio: cupyconv or every alternative failed
            ax.text(limits[0] * 1.1, y, "no ratio (see the JSON)", fontsize=7, color="0.4", verticalalignment="center")
    ax.set_xscale("log")
    ax.set_xlim(*limits)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    ax.set_title(PASSES[pass_], fontsize=9)
    ax.set_xlabel("cupyconv time / alternative time (left of 1: cupyconv faster)", fontsize=8)


def _floor_panel(ax, placed) -> None:
    """cupyconv's fraction of the roofline floor, a marker per pass."""
    from matplotlib.ticker import PercentFormatter
    for pass_, marker in FLOOR_MARKERS.items():
        points = [(row.floor_fraction[pass_], y) for y, row in placed if pass_ in row.floor_fraction]
        ax.scatter([x for x, _ in points], [y for _, y in points], s=22, marker=marker, edgecolors="black",
                   facecolors="none" if pass_ == "fwd+bwd" else "black", label=f"cupyconv, {PASSES[pass_]}", zorder=3)
    ax.set_xscale("log")
    ax.set_xlim(*_log_limits([v for _, row in placed for v in row.floor_fraction.values()]))
    ax.xaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=None))
    ax.set_title("cupyconv at the roofline floor", fontsize=9)
    ax.set_xlabel("floor time / cupyconv time (100%: at the floor)", fontsize=8)


def _save(fig, out: Path) -> None:
    """A 128-colour palette keeps a 60-case plot near 80 KB instead of 240 KB (RGBA), with no visible change (Pillow
    comes with matplotlib).  Written under another name first: never a half-written PNG under the real one."""
    from PIL import Image
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png")
    partial = out.with_name(out.name + ".partial")
    Image.open(rendered).convert("RGB").quantize(PNG_COLOURS).save(partial, format="png", optimize=True)
    partial.replace(out)
