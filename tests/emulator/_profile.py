"""Emulated memory counters: what `EmulatedDevice(counters=True)` records per launch, and a table of it.

The profile build (include/emu_counters.h) counts, per static memory access site, the warp requests a GPU would
issue and what each costs: 32-byte sectors and 128-byte lines of global memory, shared-memory wavefronts under
the bank rules.  These are emulator counts of the access pattern, not measurements: no cache is modelled.
"""
from __future__ import annotations

import ctypes
import functools
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import _build

FRAMES = 4  # emu_counters.h kFrames: the access's address and three call sites
KINDS = {(0, 0): "global_load", (0, 1): "global_store", (1, 0): "shared_load", (1, 1): "shared_store"}


@dataclass
class SiteCounters:
    """One static access site of a launch: `site` "file:line", `kind` global_load | global_store | shared_load |
    shared_store, `width` bytes per lane access.  requests: warp instructions (one per k-th execution of the site
    by the lanes of a warp between synchronisation points); lane_accesses: the lanes' accesses in them; global
    memory: sectors (32 bytes) and lines (128 bytes) touched, summed over requests, useful_bytes (distinct bytes
    requested) and moved_bytes (sectors x 32); shared memory: wavefronts (bank-conflict passes), useful_bytes."""
    site: str
    kind: str
    width: int
    requests: int = 0
    lane_accesses: int = 0
    sectors: int = 0
    lines: int = 0
    useful_bytes: int = 0
    moved_bytes: int = 0
    wavefronts: int = 0

    @property
    def sectors_per_request(self) -> float:
        return self.sectors / self.requests if self.requests else 0.0

    @property
    def lines_per_request(self) -> float:
        return self.lines / self.requests if self.requests else 0.0

    @property
    def wavefronts_per_request(self) -> float:
        return self.wavefronts / self.requests if self.requests else 0.0

    @property
    def lanes_per_request(self) -> float:
        return self.lane_accesses / self.requests if self.requests else 0.0

    @property
    def sector_efficiency(self) -> float | None:
        """useful / moved bytes of global memory (None for shared memory)."""
        return self.useful_bytes / self.moved_bytes if self.moved_bytes else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(sectors_per_request=self.sectors_per_request, wavefronts_per_request=self.wavefronts_per_request,
                 sector_efficiency=self.sector_efficiency)
        return d


@dataclass
class LaunchProfile:
    """The counters of one launch: `blocks_run` of the grid's blocks ran (all, or the `blocks=` sample), and
    `sites` are their accesses, sorted by site and kind."""
    source: str
    name: str
    grid: tuple
    block: tuple
    shared_mem: int
    blocks_run: int
    sites: list = field(default_factory=list)

    def site(self, where: str, kind: str | None = None) -> SiteCounters:
        """The one site at `where` ("file:line", or ":line"), of `kind` if given."""
        found = [s for s in self.sites if (s.site == where or s.site.endswith(where)) and kind in (None, s.kind)]
        if len(found) != 1:
            raise KeyError(f"{len(found)} sites match {where!r} {kind or ''} in {[s.site for s in self.sites]}")
        return found[0]

    def total(self, kind: str) -> SiteCounters:
        """Every site of one kind added up (width 0)."""
        out = SiteCounters("all", kind, 0)
        for s in self.sites:
            if s.kind == kind:
                for name in ("requests", "lane_accesses", "sectors", "lines", "useful_bytes", "moved_bytes",
                             "wavefronts"):
                    setattr(out, name, getattr(out, name) + getattr(s, name))
        return out

    def to_dict(self) -> dict:
        return dict(source=self.source, name=self.name, grid=list(self.grid), block=list(self.block),
                    shared_mem=self.shared_mem, blocks_run=self.blocks_run, sites=[s.to_dict() for s in self.sites])


# ---------------------------------------------------------------------------------------------------------
# From the library's counts to sites


@functools.lru_cache(maxsize=64)
def _locations(library: str, offsets: tuple) -> dict:
    """{offset: [(file, line), ... innermost first, through inlined calls]} by addr2line on the library."""
    if not offsets:
        return {}
    # A return address points past its call: the instruction before it is the access (or the call).
    args = ["addr2line", "-a", "-i", "-e", library] + [hex(max(o - 1, 0)) for o in offsets]
    try:
        text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {o: [] for o in offsets}
    result, current = {}, None
    by_address = {max(o - 1, 0): o for o in offsets}
    for line in text.splitlines():
        if line.startswith("0x"):
            current = by_address.get(int(line, 16))
            result[current] = []
            continue
        path, _, number = line.rpartition(":")
        number = number.split()[0] if number else "?"
        if current is not None and path and number.isdigit():
            result[current].append((path, int(number)))
    return result


def _site_name(chain: list, kernel_dir: Path) -> str | None:
    """The innermost location in the kernel's own files (not the emulator's headers, not the C++ library)."""
    include = str(_build.INCLUDE_DIR)
    for path, line in chain:
        if path.startswith(include) or path.startswith("/usr/") or path.endswith("launchers.cpp"):
            continue
        p = Path(path)
        try:
            name = str(p.resolve().relative_to(kernel_dir))
        except ValueError:
            name = p.name
        return f"{name}:{line}"
    return None


def name_places(message: str, library: Path, kernel_dir: Path) -> str:
    """`message` with each "@pc:0x<offset>:0" (emu_runtime.h's shared_access: an access's return address in the
    library) replaced by its file:line, or by the library offset where addr2line cannot tell."""
    def place(match: re.Match) -> str:
        offset = int(match.group(1), 16)
        chain = _locations(str(library), (offset,)).get(offset) or []
        name = _site_name(chain, kernel_dir) or (f"{Path(chain[0][0]).name}:{chain[0][1]}" if chain else None)
        return name or f"{library.name}+{hex(offset)}"
    return re.sub(r"@pc:0x([0-9a-f]+):0", place, message)


def read_sites(cdll, library: Path, kernel_dir: Path) -> list[SiteCounters]:
    """The profile library's counts of its last launch, merged per (file:line, kind, width)."""
    count = cdll.emu_profile_site_count()
    raw = []
    row = (ctypes.c_longlong * (FRAMES + 9))()
    for i in range(count):
        cdll.emu_profile_site(i, row)
        raw.append(list(row))
    offsets = tuple(sorted({o for r in raw for o in r[:FRAMES] if o >= 0}))
    where = _locations(str(library), offsets)
    merged: dict = {}
    for r in raw:
        frames, (space, write, width, requests, lanes, sectors, lines, useful, waves) = r[:FRAMES], r[FRAMES:]
        name = None
        for o in frames:  # the access itself, then its callers
            if o >= 0 and name is None:
                name = _site_name(where.get(o, []), kernel_dir)
        key = (name or "?", KINDS[space, write], width)
        s = merged.setdefault(key, SiteCounters(*key))
        s.requests += requests
        s.lane_accesses += lanes
        s.sectors += sectors
        s.lines += lines
        s.useful_bytes += useful
        s.moved_bytes += 32 * sectors
        s.wavefronts += waves
    return sorted(merged.values(), key=_order)


def _order(s: SiteCounters):
    path, _, line = s.site.rpartition(":")
    return (path, int(line) if line.isdigit() else 0, s.kind, s.width)


# ---------------------------------------------------------------------------------------------------------
# Reports


def profile_report(profiles, *, min_requests: int = 0) -> str:
    """A table per launch: each site's requests and per-request sectors, lines, wavefronts and sector efficiency
    (emulator counts of the access pattern, not GPU measurements)."""
    if isinstance(profiles, LaunchProfile):
        profiles = [profiles]
    out = []
    for p in profiles:
        out.append(f"{p.source}: {p.name}  grid {tuple(p.grid)} block {tuple(p.block)} shared {p.shared_mem} B  "
                   f"({p.blocks_run} blocks run)")
        out.append(f"  {'site':<22} {'kind':<13} {'B':>2} {'requests':>9} {'lanes/req':>9} {'sect/req':>8} "
                   f"{'lines/req':>9} {'wavef/req':>9} {'sector eff':>10}")
        for s in p.sites:
            if s.requests < min_requests:
                continue
            global_ = s.kind.startswith("global")
            eff = f"{s.sector_efficiency:.1%}" if s.sector_efficiency is not None else "-"
            out.append(f"  {s.site:<22} {s.kind:<13} {s.width:>2} {s.requests:>9} {s.lanes_per_request:>9.1f} "
                       f"{s.sectors_per_request if global_ else 0:>8.2f} {s.lines_per_request if global_ else 0:>9.2f} "
                       f"{s.wavefronts_per_request:>9.2f} {eff:>10}")
    return "\n".join(out)
