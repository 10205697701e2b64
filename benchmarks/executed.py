"""The instructions a launch executes, estimated from its SASS and the emulator's run of it.  PREDICTIONS.

`benchmarks.sass.main_loop` counts a kernel's main loop statically: every instruction once per trip, a loop
nested in it once, both sides of every branch.  A staging loop that runs 21 times a trip, or a branch that a
launch never takes, is counted wrong.  This module counts what the launch runs instead, per SASS basic block:

1. **Code with source lines.**  `KernelSass.code` (NVRTC's -lineinfo, which leaves the instructions unchanged):
   each instruction's opcode and "file:line" in raw_kernels/, and its branch target.
2. **Anchors.**  The emulator's counters (`tests/emulator`, the sampled blocks `benchmarks.predict` already runs)
   give, per static memory access site (file:line, kind), the warp requests: how many times a warp issued that
   access (a GPU issues an access for the warp when any lane makes it).  A site that the compiler made into m
   SASS instructions (unrolled copies, inlined calls) has its requests shared equally among them, by bytes: each
   copy ran (requests x bytes per lane) / (the copies' bytes per lane) times, so that four 4-byte reads the
   compiler merged into one LDS.128 count once.  A copy outside a loop that another copy of its site is in (a
   pipeline's prologue and main loop calling one load helper) runs at most as often as its own nest (once per
   warp outside every loop), and the rest goes to the loop's copies (`copy_runs`).  The split between copies may
   be wrong (an unrolled-by-4 loop and its remainder), but the site's total is right, and so is the total of
   code that runs as often as its copies.  Only plain loads and stores anchor (LDG, STG, LDS, STS, RED, ATOM):
   the counters do not see ldmatrix or cp.async the way SASS does.  A site the counters never saw ran 0 times
   (the branch not taken).
3. **Blocks.**  A basic block runs as often as its most-run anchor (a predicated copy is issued whenever its
   block runs, even where the emulator's lanes skipped it), and so do the blocks of its straight run (joined by
   edges without a branch: the only way out of one, the only way into the next).  A block without anchors takes,
   outside every loop, one run per warp; inside loops the count of the nearest anchored block in the same loop
   nest (the next one first: address arithmetic precedes its loads), else of the nearest in an enclosing nest;
   then none where every block leading to it, or every block it leads to, runs none (an untaken branch's
   address arithmetic); and outside loops, at most as often as the blocks leading to it together, and (unless it
   may end the warp) as those it leads to together, a loop counted as its most-run block (`flow_bound`: the
   prologue after an early return is not charged to the warps that returned).
4. **Totals.**  Executed warp instructions = the sum of block counts x block sizes; per class (FFMA ...) the
   same; `global_waits` = the executions of blocks that hold a global load whose result the same block reads
   (`sass.used_before_branch`), counted as that load's own runs (a warp whose lanes all skip it, in the padding,
   does not wait): a warp waits a load's latency once per such run (the loads of one block are issued together
   before the first use; a load used only past a branch is taken as overlapped).

The counts are those of the sampled blocks; the caller scales them to the grid.  Unrolled and inlined code is
counted right where its copies are alike in size; code without a memory access of its own inherits a
neighbour's count (a loop of register arithmetic only is taken to run once per enclosing trip).
"""
from __future__ import annotations

from collections import Counter, defaultdict

from .sass import CLASS_OF, FMA, mnemonic


def access_bytes(opcode: str) -> int:
    """Bytes per lane of a load or store opcode (benchmarks.predict's rule: 'LDS.128' -> 16, 'LDG.E.U16' -> 2)."""
    from .predict import access_bytes as rule
    return rule(opcode)

# SASS mnemonic -> the emulator counters' access kind it anchors to
ANCHOR_KIND = {"LDG": "global_load", "STG": "global_store", "RED": "global_store", "ATOM": "global_store",
               "ATOMG": "global_store", "LDS": "shared_load", "STS": "shared_store"}


def basic_blocks(code: list[list]) -> list[tuple[int, int]]:
    """(first, last) instruction of each basic block of `code` (KernelSass.code): a block starts at the kernel's
    first instruction, at every branch target and after every branch or EXIT."""
    leaders = {0}
    for i, (opcode, _site, _predicated, target, *_rest) in enumerate(code):
        if CLASS_OF.get(mnemonic(opcode)) == "branch":
            leaders.add(i + 1)
            if 0 <= target < len(code):
                leaders.add(target)
    starts = sorted(s for s in leaders if s < len(code))
    return [(s, (starts[k + 1] if k + 1 < len(starts) else len(code)) - 1) for k, s in enumerate(starts)]


def edges(code: list[list], blocks: list[tuple[int, int]]) -> tuple[list[list[int]], list[list[int]]]:
    """(successors, predecessors) of each block: its branch's target, and the next block unless it ends in an
    unpredicated BRA or EXIT."""
    start = {first: k for k, (first, _last) in enumerate(blocks)}
    successors: list[list[int]] = []
    for k, (first, last) in enumerate(blocks):
        opcode, _site, predicated, target, *_rest = code[last]
        op = mnemonic(opcode)
        out = []
        if CLASS_OF.get(op) == "branch" and target in start:
            out.append(start[target])
        falls_through = not (op in ("BRA", "EXIT", "RET", "JMP", "BRX") and not predicated)
        if falls_through and k + 1 < len(blocks):
            out.append(k + 1)
        successors.append(out)
    predecessors: list[list[int]] = [[] for _ in blocks]
    for k, out in enumerate(successors):
        for j in out:
            predecessors[j].append(k)
    return successors, predecessors


def straight_runs(code: list[list], blocks: list[tuple[int, int]]) -> list[list[int]]:
    """Per block, the blocks of its straight run (itself included): blocks joined by an edge that is the only way
    out of the one and the only way into the other run equally often."""
    successors, predecessors = edges(code, blocks)
    parent = list(range(len(blocks)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k
    for k, out in enumerate(successors):
        if len(out) == 1 and len(predecessors[out[0]]) == 1:
            parent[root(out[0])] = root(k)
    members: dict[int, list[int]] = defaultdict(list)
    for k in range(len(blocks)):
        members[root(k)].append(k)
    return [members[root(k)] for k in range(len(blocks))]


def dominators(successors: list[list[int]], predecessors: list[list[int]]) -> list[set[int]]:
    """Per block, the blocks every path from the entry (block 0) to it passes (itself included); unreachable
    blocks: all blocks."""
    order, seen, stack = [], {0}, [(0, iter(successors[0]))]
    while stack:   # reverse postorder of a depth-first walk
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            order.append(node)
            stack.pop()
        elif child not in seen:
            seen.add(child)
            stack.append((child, iter(successors[child])))
    order.reverse()
    everything = set(range(len(successors)))
    dom = [set(everything) for _ in successors]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for node in order[1:]:
            incoming = [dom[p] for p in predecessors[node] if p in seen]
            new = set.intersection(*incoming) | {node} if incoming else {node}
            if new != dom[node]:
                dom[node], changed = new, True
    return dom


def loop_nests(code: list[list], blocks: list[tuple[int, int]] | None = None) -> list[frozenset]:
    """Per instruction, the natural loops that hold it, each named by its back edge (latch block, header block):
    a branch to a block that dominates it, and the loop's body the blocks that reach the latch without passing
    the header (the compiler's jumps back from code placed out of line to where it rejoins are not loops, and a
    loop's body need not be one range of addresses)."""
    blocks = blocks if blocks is not None else basic_blocks(code)
    successors, predecessors = edges(code, blocks)
    dom = dominators(successors, predecessors)
    holding: list[set] = [set() for _ in blocks]
    for latch, out in enumerate(successors):
        for header in out:
            if header not in dom[latch] or header > latch:
                continue
            body, todo = {header, latch}, [latch] if latch != header else []   # never walks past the header
            while todo:
                node = todo.pop()
                for p in predecessors[node]:
                    if p not in body:
                        body.add(p)
                        todo.append(p)
            for k in body:
                holding[k].add((latch, header))
    nests = []
    for k, (first, last) in enumerate(blocks):
        nests += [frozenset(holding[k])] * (last - first + 1)
    return nests


def flow_bound(code: list[list], blocks: list[tuple[int, int]], nests: list[frozenset],
               counts: list[float | None], filled: list[float]) -> None:
    """Caps, in place, the runs of each block outside every loop that no anchor counted (taken as once per warp):
    a block runs at most as often as its predecessors together (a warp enters it from one of them; the first
    block once per warp) and, unless it may end the warp (an EXIT, predicated or not, or a jump whose target is
    unknown), at most as often as its successors together (it leaves to one of them).  A prologue after an
    early return is then charged to the warps that reach the loop after it, not to the warps that returned;
    code that a branch skips for every warp is still charged where its neighbours run (the counters do not say
    which way the warps went)."""
    successors, predecessors = edges(code, blocks)
    indirect = any(mnemonic(c[0]) in ("BRX", "JMP") for c in code)   # targets unknown: predecessors incomplete
    free = [k for k, c in enumerate(counts) if c is None and not nests[blocks[k][0]]]
    # A block inside loops, seen from outside them (entered or left): as often as the most-run block of its loops
    # (a header runs at least as often as any block of its loop, its estimate may be a neighbour's, and a loop is
    # entered or left at most as often as its header runs).
    headers = [{header for _latch, header in nests[first]} for first, _last in blocks]
    loop_max: dict[int, float] = defaultdict(float)
    for held, count in zip(headers, filled):
        for header in held:
            loop_max[header] = max(loop_max[header], count)
    seen = [max(loop_max[header] for header in held) if held else None for held in headers]

    def flow(j: int) -> float:
        return filled[j] if seen[j] is None else seen[j]
    for _sweep in range(len(blocks) + 1):   # bounds only fall; the free blocks form no cycle but through loops
        changed = False
        for k in free:
            if k == 0:   # the entry: once per warp, whatever the counts after it say
                continue
            bounds = [filled[k]]
            if predecessors[k] and not indirect:
                bounds.append(sum(flow(j) for j in predecessors[k]))
            last = mnemonic(code[blocks[k][1]][0])
            if successors[k] and last not in ("EXIT", "RET", "BRX", "JMP"):
                bounds.append(sum(flow(j) for j in successors[k]))
            if min(bounds) < filled[k]:
                filled[k] = min(bounds)
                changed = True
        if not changed:
            break


def site_request_bytes(sites: list[dict]) -> dict[tuple[str, str], float]:
    """{(file:line, kind): warp requests x bytes per lane} of the counters' sites (widths added up): what the
    site's SASS copies share, whatever width each has (four 4-byte reads of the emulator that the compiler made one
    LDS.128, or one 16-byte copy split into four LDS)."""
    request_bytes: dict = defaultdict(float)
    for site in sites:
        request_bytes[site["site"], site["kind"]] += site["requests"] * max(1, site["width"])
    return dict(request_bytes)


def copy_runs(code: list[list], nests: list[frozenset], request_bytes: dict, warps: int) -> dict[int, float]:
    """{instruction: runs} of every anchor: its site's request bytes shared among the site's SASS copies, equally
    by bytes, except that a copy outside a loop that another copy of the same site is in (the first chunk that a
    pipeline's prologue issues, by the helper its loop calls too) runs at most as often as its own nest runs: once
    per warp outside every loop, else as often as the most-run anchor of a site whose copies all share that nest
    (unknown without one: the equal share).  The requests such a copy cannot have made go to the copies in the
    loop.  Exact where the prologue ran once per warp; where some warps skipped it (fewer chunks than the
    prologue issues, an early return) the prologue is over-counted and the loop under-counted by as much: the
    site's total stays right either way (p-seed's simt_fwd: the equal share ran its prologue's copy blocks and its
    loop's 6.33 times a warp each, instead of 1 and 17)."""
    copies: dict = defaultdict(list)   # (site, kind) -> [(instruction, bytes per lane)]
    for i, (opcode, site, *_rest) in enumerate(code):
        kind = ANCHOR_KIND.get(mnemonic(opcode))
        if kind and site:
            copies[site, kind].append((i, access_bytes(opcode)))

    def equal(key) -> float:
        return request_bytes.get(key, 0.0) / sum(b for _i, b in copies[key])
    # How often each loop nest runs, from the sites whose copies all lie in it (their equal share is right).
    nest_runs: dict[frozenset, float] = {frozenset(): float(warps)}
    for key, held in copies.items():
        held_nests = {nests[i] for i, _b in held}
        if len(held_nests) == 1 and key in request_bytes:
            nest, = held_nests
            if nest:
                nest_runs[nest] = max(nest_runs.get(nest, 0.0), equal(key))
    runs: dict[int, float] = {}
    for key, held in copies.items():
        total = request_bytes.get(key, 0.0)
        # outer copies: a nest strictly inside another copy's (a subset of its loops), with a known run count
        caps = {i: nest_runs[nests[i]] for i, _b in held if nests[i] in nest_runs
                and any(nests[i] < nests[j] for j, _b in held)}
        capped: dict[int, float] = {}
        while True:   # the caps below the share hold; the rest share what is left (the share only rises)
            rest = [(i, b) for i, b in held if i not in capped]
            left = total - sum(capped[i] * b for i, b in held if i in capped)
            each = left / sum(b for _i, b in rest) if rest else 0.0
            over = {i: caps[i] for i, _b in rest if i in caps and caps[i] < each}
            if not over or len(over) == len(rest):
                break
            capped.update(over)
        for i, _b in held:
            runs[i] = capped.get(i, each)
    return runs


def estimate(code: list[list], sites: list[dict], warps: int) -> dict | None:
    """Executed instructions of the sampled blocks (`warps` warps) from the kernel's `code` and the counters'
    `sites` of the same blocks: {"instructions", "mix": {class: executed}, "global_waits", "blocks": [(first,
    last, count)], "anchored": share of the code's anchors whose site the counters name}; None where no anchor
    maps (no line table, or no counted site in the kernel's code)."""
    if not code or not sites:
        return None
    request_bytes = site_request_bytes(sites)
    counted_lines = {site for site, _kind in request_bytes}
    copies: Counter = Counter()   # (site, kind) -> its SASS copies
    for opcode, site, *_rest in code:
        kind = ANCHOR_KIND.get(mnemonic(opcode))
        if kind and site:
            copies[site, kind] += 1
    if not copies or not any(key in request_bytes for key in copies):
        return None

    blocks = basic_blocks(code)
    nests = loop_nests(code, blocks)
    group = straight_runs(code, blocks)
    runs = copy_runs(code, nests, request_bytes, warps).get   # anchor instruction -> its runs, else None

    counts: list[float | None] = [None] * len(blocks)
    for k, (first, last) in enumerate(blocks):
        anchors = [r for r in map(runs, range(first, last + 1)) if r is not None]
        if anchors:
            counts[k] = max(anchors)
    for members in set(map(tuple, group)):   # blocks run one after another without a branch between: alike
        known = [counts[k] for k in members if counts[k] is not None]
        if known:
            for k in members:
                counts[k] = max(known)   # type: ignore[type-var]
    anchored = [k for k, c in enumerate(counts) if c is not None]
    filled: list[float] = []
    for k, c in enumerate(counts):
        nest = nests[blocks[k][0]]
        while c is None:
            candidates = [j for j in anchored if nests[blocks[j][0]] == nest]
            if not nest:     # outside every loop: once per warp
                c = float(warps)
            elif candidates:   # the nearest by position, the following block first on a tie
                c = counts[min(candidates, key=lambda j: (abs(j - k), j < k))]
            else:            # the enclosing nest: without its innermost loop (the one whose header is last)
                nest = nest - {max(nest, key=lambda loop: loop[1])}
        filled.append(c)
    # Code that only an unrun block leads to, or that only leads to unrun blocks, does not run either (the address
    # arithmetic of an untaken branch's loads): to a fixed point, over the blocks no anchor counted.
    successors, predecessors = edges(code, blocks)
    changed = True
    while changed:
        changed = False
        for k in range(len(blocks)):
            if counts[k] is not None or filled[k] == 0 or k == 0:
                continue
            ends = mnemonic(code[blocks[k][1]][0]) == "EXIT"
            if (predecessors[k] and all(filled[j] == 0 for j in predecessors[k])) or \
                    (not ends and successors[k] and all(filled[j] == 0 for j in successors[k])):
                filled[k] = 0.0
                changed = True
    flow_bound(code, blocks, nests, counts, filled)
    mix: dict[str, float] = defaultdict(float)
    fma: dict[str, float] = defaultdict(float)
    waits = 0.0
    for (first, last), count in zip(blocks, filled):
        for i in range(first, last + 1):
            op = mnemonic(code[i][0])
            mix[CLASS_OF.get(op, "other")] += count
            if op in FMA:
                fma[op] += count
        waited = [runs(i) for i in range(first, last + 1) if code[i][4]]
        if waited:   # as often as its waited load was issued (none where every lane's load is predicated off)
            waits += min(count, max((r for r in waited if r is not None), default=count))
    maps = sum(n for key, n in copies.items() if key[0] in counted_lines)
    return {"instructions": sum(mix.values()), "mix": dict(mix), "fma": dict(fma), "global_waits": waits,
            "blocks": [(first, last, round(count, 3)) for (first, last), count in zip(blocks, filled)],
            "anchored": round(maps / sum(copies.values()), 3)}
