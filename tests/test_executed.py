"""benchmarks.executed: the instructions a launch executes, from its SASS (NVRTC -lineinfo) and the emulator's
per-site warp requests, on self-test kernels whose executed counts are known from their SASS
(tests/emulator/selftest_kernels/executed.cu): a loop with a run-time trip count, a branch no thread takes, a loop
unrolled by 4 with its remainder, a pipeline whose prologue and loop share a load site."""
from __future__ import annotations

import numpy
import pytest

from benchmarks import executed, predict, sass
from emulator import SELFTEST_KERNEL_DIR, EmulatedDevice

SOURCE = "executed.cu"
KERNELS = ["executed_loop", "executed_unrolled", "executed_pipeline"]
WARPS = 2   # one block of 64 threads


@pytest.fixture(scope="module")
def codes():
    """{kernel: KernelSass.code} of the self-test kernels, compiled for sm_90 with a line table."""
    try:
        compiler = sass.nvrtc(sass.ARCHES["sm_90"])
        sass.tool("nvdisasm")
    except sass.ToolMissing as e:
        pytest.skip(str(e))
    text = (SELFTEST_KERNEL_DIR / SOURCE).read_text()
    program = compiler.compile(text, SOURCE, KERNELS, ["--gpu-architecture=sm_90", sass.LINEINFO, "-std=c++17"])
    assert program.ok, program.log
    lines = sass.source_lines(SOURCE, SELFTEST_KERNEL_DIR)
    listing = sass.disassemble(program, lines=True)
    return {name: sass.code_of(listing[name], SOURCE, lines) for name in KERNELS}


def line_of(marker: str) -> int:
    lines = (SELFTEST_KERNEL_DIR / SOURCE).read_text().splitlines()
    found = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"// @{marker}")]
    assert len(found) == 1, marker
    return found[0]


def counted_sites(name: str, *scalars: int) -> list[dict]:
    """The counters' sites of one launch of `name` on one block of 64 threads (fresh random x, y poisoned)."""
    device = EmulatedDevice(kernel_dir=SELFTEST_KERNEL_DIR, instantiations=[(SOURCE, k) for k in KERNELS],
                            counters=True)
    x = numpy.random.default_rng().standard_normal(64 * 40).astype(numpy.float32)
    y = device.empty(64, numpy.float32)
    device.launch(SOURCE, name, 1, 64, [x, y, *map(numpy.int32, scalars)])
    assert not numpy.isnan(y).any()
    return [site.to_dict() for site in device.profile[-1].sites]


def test_a_loop_runs_its_trips_and_an_untaken_branch_nothing(codes):
    """executed_loop: what runs is the code outside the loop and the branch once per warp, the loop once per trip;
    counted from the SASS itself (its one loop, the lines inside the branch), not from the estimate's blocks."""
    code = codes["executed_loop"]
    (first, last), = sass.loops([{"opcode": c[0], "operands": hex(16 * c[3])} for c in code])
    loop = last - first + 1
    inside = range(line_of("loop") + 2, line_of("rare") + 2)   # the lines of the branch's body
    branch = sum(int(site.rsplit(":", 1)[1]) in inside for _op, site, *_ in code if site)
    assert loop >= 3 and branch >= 16 + 1   # its 16 loads are static instructions
    for trips in (8, 16):
        estimate = executed.estimate(code, counted_sites("executed_loop", trips, 0), WARPS)
        assert estimate["instructions"] == WARPS * (len(code) - loop - branch + trips * loop)
        assert estimate["global_waits"] == WARPS * trips   # each trip loads and uses x
        assert estimate["anchored"] < 0.5   # most of its loads are the branch's: sites the emulator never saw
    # The branch taken: its code runs once per warp (its loads are CSE'd by the compiler, not by the emulator's
    # -O0 build, so the estimate may put it higher, never lower).
    taken = executed.estimate(code, counted_sites("executed_loop", 16, 1), WARPS)
    assert taken["instructions"] >= WARPS * (len(code) - loop + 16 * loop)


def test_unrolled_copies_share_their_sites_requests(codes):
    """executed_unrolled: one source load, 4 copies in the unrolled loop and 1 in its remainder loop.  Each copy
    gets an equal share of the load's requests, so 16 more trips add 4 trips of the unrolled loop within the bias
    of the equal split (the remainder loop's instructions counted as if it ran as often as each copy)."""
    code = codes["executed_unrolled"]
    spans = sass.loops([{"opcode": c[0], "operands": hex(16 * c[3])} for c in code])
    main = max(spans, key=lambda s: sum(code[i][0].startswith("LDG") for i in range(s[0], s[1] + 1)))
    assert sum(code[i][0].startswith("LDG") for i in range(main[0], main[1] + 1)) == 4
    counts = {trips: executed.estimate(code, counted_sites("executed_unrolled", trips), WARPS)["instructions"]
              for trips in (16, 32)}
    exact = WARPS * (32 - 16) // 4 * (main[1] - main[0] + 1)
    assert 0.9 * exact <= counts[32] - counts[16] <= 1.3 * exact


def test_a_prologue_and_its_loop_sharing_a_site_run_once_and_trips_times(codes):
    """executed_pipeline: one helper stages x in shared memory before the loop and inside it, so its load and store
    have a SASS copy outside the loop and one in it.  The prologue's copy ran once per warp and the loop's `trips`
    times (an equal share of the site's requests put (1 + trips) / 2 on each: the prologue charged 4.5 and 8.5
    times a warp, as simt_fwd's cp.async prologue was); the whole count is exact, from the SASS's one loop."""
    code = codes["executed_pipeline"]
    (first, last), = sass.loops([{"opcode": c[0], "operands": hex(16 * c[3])} for c in code])
    loop = last - first + 1
    line = f"executed.cu:{line_of('pipeline')}"
    where = [i for i, c in enumerate(code) if c[1] == line and c[0].startswith(("LDG", "STS"))]
    assert [first <= i <= last for i in where] == [False, False, True, True]   # load, store: prologue, then loop
    for trips in (8, 16):
        sites = counted_sites("executed_pipeline", trips)
        assert {s["requests"] for s in sites if s["site"] == line} == {WARPS * (1 + trips)}
        estimate = executed.estimate(code, sites, WARPS)
        runs = {start: count for start, _end, count in estimate["blocks"]}
        assert runs[first] == WARPS * trips and runs[0] == WARPS
        assert estimate["instructions"] == WARPS * (len(code) - loop + trips * loop)


def test_lineinfo_leaves_the_instructions_unchanged(codes):
    """The model compiles with -lineinfo (for the line table); the instructions must be those CuPy runs."""
    from cupyconv import _device
    names = [n for f, n in _device.all_instantiations() if f == "unfold.cu"][:6]
    plain = sass.disassemble(sass.compile_names("unfold.cu", "sm_90", names))
    plain = {n: [(i["opcode"], i.get("operands"), i.get("predicate")) for i in v] for n, v in plain.items()}
    with_lines = sass.disassemble(sass.compile_names("unfold.cu", "sm_90", names, lineinfo=True), lines=True)
    assert {n: [(i["opcode"], i.get("operands"), i.get("predicate")) for i in v] for n, v in with_lines.items()} \
        == plain
    assert all(i["source"] for v in with_lines.values() for i in v[:1])


def test_source_lines_name_the_included_headers():
    """The line numbers NVRTC reports are of the text with its headers inlined; source_lines maps them back."""
    from cupyconv import _device
    text = _device.kernel_source("depthwise.cu").splitlines()
    lines = sass.source_lines("depthwise.cu")
    assert len(lines) == len(text)
    header = (_device.kernel_dir() / "common.cuh").read_text().splitlines()
    probe = next(i for i, t in enumerate(header) if t.strip().startswith("template") and header.count(t) == 1)
    assert lines[text.index(header[probe])] == f"common.cuh:{probe + 1}"
    own = (_device.kernel_dir() / "depthwise.cu").read_text().splitlines()
    last = len(own) - next(i for i, t in enumerate(reversed(own)) if t.strip() and own.count(t) == 1) - 1
    assert lines[len(text) - 1 - text[::-1].index(own[last])] == f"depthwise.cu:{last + 1}"


def test_the_model_keeps_the_static_count_where_it_cannot_count():
    """No emulator counts, or a tensor-core kernel: the static main loop, and the reason why."""
    work = {"warp_instructions": (10.0, 20.0)}
    launch = type("L", (), {"threads": 64})()
    kept = predict.apply_executed(work, {"code": [["LDG.E", "a.cu:1", 0, -1, 1]], "loop_rule": "fma"},
                                  {"source": "analytic"}, launch)
    assert kept["instructions_source"] == "static" and kept["warp_instructions"] == (10.0, 20.0)
    kept = predict.apply_executed(work, {"code": [["LDG.E", "a.cu:1", 0, -1, 1]], "loop_rule": "matrix"},
                                  {"source": "emulator", "sites": [], "blocks_run": 1, "scale": 1.0}, launch)
    assert "tensor-core" in kept["instructions_why"]
    sites = [{"site": "a.cu:1", "kind": "global_load", "width": 4, "requests": 6}]
    counted = predict.apply_executed(work, {"code": [["LDG.E", "a.cu:1", 0, -1, 1], ["EXIT", "", 0, -1, 0]],
                                            "loop_rule": "memory"},
                                     {"source": "emulator", "sites": sites, "blocks_run": 1, "scale": 10.0}, launch)
    # one block of 2 warps ran the load's block 6 times (3 a warp, each waited for), scaled to 10 blocks
    assert counted["instructions_source"] == "executed" and counted["warp_instructions"] == (120.0, 120.0)
    assert counted["executed"]["global_waits_per_warp"] == 3.0


# Synthetic KernelSass.code: [opcode, "file:line", predicated, branch target, waited]; one global load at a.cu:1
def early_return(loop_body: int = 1) -> list[list]:
    """Warps whose lanes all return at the predicated EXIT (block 0), a prologue without a memory access (block
    1), a loop around the load (block 2), the EXIT after it (block 3)."""
    return [["S2R", "a.cu:2", 0, -1, 0], ["ISETP.GE.AND", "a.cu:2", 0, -1, 0], ["EXIT", "a.cu:2", 1, -1, 0],
            *[["IMAD", "a.cu:3", 0, -1, 0]] * 5,
            ["LDG.E", "a.cu:1", 0, -1, 0], *[["FADD", "a.cu:1", 0, -1, 0]] * loop_body,
            ["BRA", "a.cu:1", 1, 8, 0],
            ["EXIT", "a.cu:4", 0, -1, 0]]


def load(requests: float) -> list[dict]:
    return [{"site": "a.cu:1", "kind": "global_load", "width": 4, "requests": requests}]


def block_runs(estimate: dict) -> list[float]:
    return [count for _first, _last, count in estimate["blocks"]]


def test_code_after_an_early_return_is_charged_to_the_warps_that_reach_it():
    """8 warps, 6 of which return at once; the other 2 run the loop once: the prologue and the final EXIT ran
    twice, not 8 times (the rule before the flow bound charged every warp that returned for them)."""
    code = early_return()
    estimate = executed.estimate(code, load(2), 8)
    assert block_runs(estimate) == [8, 2, 2, 2]
    assert estimate["instructions"] == 8 * 3 + 2 * 5 + 2 * 3 + 2 * 1
    # More trips: the prologue is capped by the loop's runs (5 here; exactly 2 warps entered, which the counters
    # do not say), never above once per warp.
    assert block_runs(executed.estimate(code, load(5), 8)) == [8, 5, 5, 5]
    assert block_runs(executed.estimate(code, load(40), 8)) == [8, 8, 40, 8]


def test_a_branch_skipped_after_an_early_return_is_capped_by_the_loop():
    """7 warps of 8 return (block 0); a branch (block 1) skips code (block 2) before arithmetic (block 3) that
    falls into a loop which the last warp runs once: blocks 2 and 3 run at most once, the branch at most as
    often as both (the rule before the flow bound: 8 each).  Where the skipped code is followed by code that
    every warp runs, it stays charged: the counters do not say which way the warps went."""
    code = [["S2R", "a.cu:2", 0, -1, 0], ["ISETP.GE.AND", "a.cu:2", 0, -1, 0], ["EXIT", "a.cu:2", 1, -1, 0],
            ["ISETP.GE.AND", "a.cu:6", 0, -1, 0], ["BRA", "a.cu:6", 1, 7, 0],   # block 1: the branch
            ["IMAD", "a.cu:5", 0, -1, 0], ["IMAD", "a.cu:5", 0, -1, 0],          # block 2: the skipped code
            ["IMAD", "a.cu:3", 0, -1, 0], ["IMAD", "a.cu:3", 0, -1, 0],          # block 3
            ["LDG.E", "a.cu:1", 0, -1, 0], ["FADD", "a.cu:1", 0, -1, 0], ["BRA", "a.cu:1", 1, 9, 0],
            ["EXIT", "a.cu:4", 0, -1, 0]]
    assert block_runs(executed.estimate(code, load(1), 8)) == [8, 2, 1, 1, 1, 1]
    guarded = code[:8] + [["BRA", "a.cu:3", 1, 12, 0]] + code[9:]   # block 3 may go to the EXIT past the loop
    assert block_runs(executed.estimate(guarded, load(1), 8)) == [8, 8, 8, 8, 1, 8]
    # the entry block runs once per warp whatever follows it (a loop whose loads every lane of 7 warps skipped)
    entry = [["S2R", "a.cu:2", 0, -1, 0], ["LDG.E", "a.cu:1", 1, -1, 0], ["BRA", "a.cu:1", 1, 1, 0],
             ["EXIT", "a.cu:4", 0, -1, 0]]
    assert block_runs(executed.estimate(entry, load(1), 8)) == [8, 1, 1]


def test_the_flow_bound_leaves_loops_and_warps_that_exit_alone():
    """A loop's blocks keep their anchors' counts; a block that may end the warp (a predicated EXIT) is not
    capped by what follows it; nothing outside loops runs more than once per warp."""
    code = early_return(loop_body=3)
    code[4] = ["EXIT", "a.cu:3", 1, -1, 0]   # the prologue's first half may return too: blocks 1 (ends) and 2
    estimate = executed.estimate(code, load(1), 8)
    assert block_runs(estimate) == [8, 8, 1, 1, 1]
    assert max(block_runs(executed.estimate(code, load(1000), 8))) == 1000
    assert block_runs(executed.estimate(code, load(1000), 8))[:2] == [8, 8]


def test_a_loop_is_seen_from_outside_as_its_most_run_block():
    """2 warps of 8 run a loop twice whose latch (block 4, no load) took the count of a load that ran once, in a
    branch (block 3): the EXIT after the loop is capped by the loop's header (4 runs), not by that latch (1)."""
    code = [["S2R", "a.cu:2", 0, -1, 0], ["ISETP.GE.AND", "a.cu:2", 0, -1, 0], ["EXIT", "a.cu:2", 1, -1, 0],
            ["IMAD", "a.cu:3", 0, -1, 0],
            ["LDG.E", "a.cu:1", 0, -1, 0], ["BRA", "a.cu:1", 1, 7, 0],   # block 2: the header
            ["LDG.E", "a.cu:7", 0, -1, 0],                                  # block 3: the branch
            ["FADD", "a.cu:8", 0, -1, 0], ["BRA", "a.cu:8", 1, 4, 0],     # block 4: the latch
            ["EXIT", "a.cu:4", 0, -1, 0]]
    sites = load(4) + [{"site": "a.cu:7", "kind": "global_load", "width": 4, "requests": 1}]
    assert block_runs(executed.estimate(code, sites, 8)) == [8, 4, 4, 1, 1, 4]


def prologue_and_loop(extra: list[list] | None = None) -> list[list]:
    """One load site (a.cu:1) with a copy before a loop (block 0) and one in it (block 1); `extra`: more of the
    loop's body."""
    return [["S2R", "a.cu:2", 0, -1, 0], ["LDG.E", "a.cu:1", 0, -1, 0], ["IMAD", "a.cu:2", 0, -1, 0],
            ["LDG.E", "a.cu:1", 0, -1, 0], *(extra or []), ["FADD", "a.cu:3", 0, -1, 0],
            ["BRA", "a.cu:3", 1, 3, 0],
            ["EXIT", "a.cu:4", 0, -1, 0]]


def test_a_site_of_a_prologue_and_its_loop_puts_the_requests_past_once_a_warp_in_the_loop():
    """8 warps, 1 + 5 requests a warp of one site: the prologue's copy once a warp, the loop's 5 times (the equal
    share: 3 and 3).  Where the site made at most once a warp a copy, the share stays equal (nothing says which copy
    the warps skipped); a wider prologue copy (LDG.64) takes its bytes' share."""
    code = prologue_and_loop()
    assert block_runs(executed.estimate(code, load(8 * 6), 8)) == [8, 40, 8]
    assert block_runs(executed.estimate(code, load(8 * 1.5), 8)) == [6, 6, 6]
    wide = [["LDG.E.64", "a.cu:1", 0, -1, 0] if i == 1 else c for i, c in enumerate(code)]
    sites = [{"site": "a.cu:1", "kind": "global_load", "width": 4, "requests": 8 * (2 + 5)}]   # 8 + 4 bytes a trip
    assert block_runs(executed.estimate(wide, sites, 8)) == [8, 40, 8]


def test_a_site_of_an_inner_loops_prologue_is_capped_by_its_outer_loop():
    """An outer loop (blocks 1-3) runs 4 times a warp (its own load, a.cu:5, says so); in it an inner loop's
    prologue (block 1) and the inner loop (block 2) share a.cu:1: 4 + 4 x 6 requests a warp go 4 and 24, not 14
    and 14.  Without the outer loop's own count the share stays equal."""
    code = [["S2R", "a.cu:2", 0, -1, 0],
            ["LDG.E", "a.cu:5", 0, -1, 0], ["LDG.E", "a.cu:1", 0, -1, 0],      # block 1: outer trip, prologue
            ["LDG.E", "a.cu:1", 0, -1, 0], ["BRA", "a.cu:3", 1, 3, 0],         # block 2: the inner loop
            ["IADD3", "a.cu:6", 0, -1, 0], ["BRA", "a.cu:6", 1, 1, 0],         # block 3: the outer loop's latch
            ["EXIT", "a.cu:4", 0, -1, 0]]
    sites = load(2 * 28) + [{"site": "a.cu:5", "kind": "global_load", "width": 4, "requests": 2 * 4}]
    assert block_runs(executed.estimate(code, sites, 2)) == [2, 8, 48, 8, 2]
    blind = [["IMAD", "a.cu:5", 0, -1, 0] if i == 1 else c for i, c in enumerate(code)]
    assert block_runs(executed.estimate(blind, load(2 * 28), 2)) == [2, 28, 28, 28, 2]
