"""The kernels' SASS, read without a GPU: resources, the main loop's instruction mix, and occupancy.

    python -m benchmarks.sass conv.cu --arch sm_90 [--names 'conv_fwd_tc<__half, int, 128, 64>']

A library for benchmarks.predict and tests/test_sass.py.  NVRTC (the CUDA 13 wheel, loaded over ctypes: `Nvrtc`)
compiles a raw_kernels/ file's instantiations exactly as CuPy's RawModule does (`_device.kernel_source`,
`_device.compile_options`) to a cubin for a real architecture; `cuobjdump -res-usage` reads each kernel's
registers, static shared memory, stack frame and local memory (`resource_usage`) and `nvdisasm -json` its
instructions (`sass_opcodes`, `main_loop`).  `analyse` does all of it per instantiation and caches the result
on disk, keyed by a hash of the NVRTC release, the source, the options, the architecture and the name
(~/.cache/cupyconv-sass, or $CUPYCONV_SASS_CACHE), so repeated model runs compile nothing.

`occupancy` applies the hardware's allocation rules (CUDA C Programming Guide, "Compute Capabilities", and the
CUDA Occupancy Calculator's rules in cuda_occupancy.h): registers allocated per warp in units of 256 (a thread's
count rounded up to a multiple of 8) from 64 Ki per SM, split over the 4 sub-partitions; at most 255 per thread;
shared memory per SM 228 KiB on sm_90 (164 KiB on sm_80) with 1 KiB reserved per block; at most 32 blocks and 64
warps per SM.

Needs the wheels of the compile-check extra: nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm (all >=13,<14); without them `ToolMissing` is raised (the tests skip, the model falls back).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

ARCHES = {"sm_70": 12, "sm_80": 13, "sm_90": 13}  # architecture -> CUDA major release whose NVRTC compiles it
# (library, include dir) inside site-packages, per CUDA major release, as the NVIDIA wheels lay them out.
WHEEL_LAYOUT = {
    12: ("nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cuda_runtime/include"),
    13: ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cu13/include"),
}
WHEELS = {12: "nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12",
          13: "'nvidia-cuda-nvrtc>=13,<14' 'nvidia-cuda-runtime>=13,<14'"}
TOOLS = "nvidia/cu13/bin"  # where the CUDA 13 wheels put cuobjdump and nvdisasm, inside site-packages
TOOL_WHEELS = "'nvidia-cuda-cuobjdump>=13,<14' 'nvidia-cuda-nvdisasm>=13,<14'"


class ToolMissing(RuntimeError):
    """NVRTC, cuobjdump or nvdisasm is not installed (the message says which wheels to install)."""


class Program(NamedTuple):
    """What NVRTC made of one program."""
    ok: bool
    log: str
    lowered: dict         # name expression -> its mangled (lowered) name
    cubin: bytes | None   # the SASS binary (ELF) for the real architecture compiled; None when compiling failed


class Nvrtc:
    """The few NVRTC entry points a compile check needs, over ctypes (two CUDA releases in one process)."""

    def __init__(self, library: Path, include: Path):
        self.include = include
        lib = self.lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.nvrtcAddNameExpression.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcGetLoweredName.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcGetCUBINSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source: str, filename: str, names: list[str], options: list[str]) -> Program:
        """One program: compiled or not, its log, {name expression: lowered name} and its cubin (options must
        name a real architecture, --gpu-architecture=sm_XY, for there to be one)."""
        lib = self.lib
        program = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), filename.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            for name in names:
                self._check(lib.nvrtcAddNameExpression(program, name.encode()), f"nvrtcAddNameExpression({name})")
            argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = lib.nvrtcCompileProgram(program, len(options), argv)
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            buffer = ctypes.create_string_buffer(size.value + 1)
            self._check(lib.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
            log = buffer.value.decode(errors="replace").strip()
            lowered, cubin = {}, None
            if status == 0:
                for name in names:
                    result = ctypes.c_char_p()
                    if lib.nvrtcGetLoweredName(program, name.encode(), ctypes.byref(result)) == 0 and result.value:
                        lowered[name] = result.value.decode()
                if lib.nvrtcGetCUBINSize(program, ctypes.byref(size)) == 0 and size.value:
                    buffer = ctypes.create_string_buffer(size.value)
                    self._check(lib.nvrtcGetCUBIN(program, buffer), "nvrtcGetCUBIN")
                    cubin = buffer.raw
            return Program(status == 0, log, lowered, cubin)
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(program))


_NVRTC: dict = {}


def nvrtc(major: int) -> Nvrtc:
    """NVRTC of CUDA `major` from the installed wheels (one instance per release); ToolMissing without them."""
    if major not in _NVRTC:
        library, include = WHEEL_LAYOUT[major]
        for entry in sys.path:
            root = Path(entry or ".")
            if (root / library).is_file() and (root / include / "cuda_fp16.h").is_file():
                _NVRTC[major] = Nvrtc(root / library, root / include)
                break
        else:
            raise ToolMissing(f"NVRTC of CUDA {major} not installed (pip install {WHEELS[major]})")
    return _NVRTC[major]


def options_for(arch: str, filename: str) -> list[str]:
    """The options of raw_kernels/<filename> (`_device.compile_options`, as CuPy gets them) for arch."""
    from cupyconv import _device
    return [*_device.compile_options(filename, int(arch[3:])), f"--gpu-architecture={arch}",
            f"-I{nvrtc(ARCHES[arch]).include}"]


def tool(name: str) -> Path:
    """cuobjdump or nvdisasm from the CUDA 13 wheels; ToolMissing when they are not installed."""
    for entry in sys.path:
        path = Path(entry or ".") / TOOLS / name
        if path.is_file():
            return path
    raise ToolMissing(f"{name} not installed (pip install {TOOL_WHEELS})")


def run_on_cubin(name: str, args: list[str], cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "kernels.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([str(tool(name)), *args, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


# ---------------------------------------------------------------------------------------------------------
# Resources


@dataclass(frozen=True)
class Usage:
    """One kernel's resources, as cuobjdump -res-usage reports them (bytes, except registers)."""
    registers: int
    stack: int
    shared: int   # static shared memory (without the system's reserved 1 KiB: see resource_usage)
    local: int    # local memory: spills and local arrays


_FUNCTION = re.compile(r"^\s*Function\s+(\S+?):\s*$")
_FIELD = re.compile(r"\b(REG|STACK|SHARED|LOCAL):(\d+)")
# The 1 KiB of shared memory the system reserves per block (cudaDevAttrReservedSharedMemoryPerBlock) lies outside
# the per-block limits.  An sm_90 cubin places it in every kernel that uses shared memory (section
# .nv.shared.reserved.0, symbol __nv_reservedSMEM_offset_0_alias at offset 0), so cuobjdump's SHARED counts it
# there, and not for sm_80; `resource_usage` takes it off (tests/test_sass.py checks this on a probe).
RESERVED_SHARED_IN_CUBIN = {"sm_80": 0, "sm_90": 1024}


def parse_res_usage(text: str) -> dict[str, Usage]:
    """{mangled kernel name: Usage} from the output of `cuobjdump -res-usage`, whose kernels read

        Function _Z13unfold_im2colIfiEvPKT_...:
          REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:624 TEXTURE:0 SURFACE:0 SAMPLER:0
    """
    result, function = {}, None
    for line in text.splitlines():
        match = _FUNCTION.match(line)
        if match:
            function = match.group(1)
            continue
        fields = dict(_FIELD.findall(line))
        if function and "REG" in fields:
            result[function] = Usage(int(fields["REG"]), int(fields.get("STACK", 0)), int(fields.get("SHARED", 0)),
                                     int(fields.get("LOCAL", 0)))
            function = None
    return result


def by_name_expression(program: Program, per_mangled: dict) -> dict:
    """{name expression: value} from {mangled name: value}, through NVRTC's lowered names."""
    return {name: per_mangled[mangled] for name, mangled in program.lowered.items() if mangled in per_mangled}


def resource_usage(program: Program, arch: str) -> dict[str, Usage]:
    """{name expression: Usage} of a kernel file compiled for arch, static shared memory as a launch counts it:
    without the reserved shared memory an sm_90 cubin adds to every kernel that uses any."""
    reserved = RESERVED_SHARED_IN_CUBIN.get(arch, 0)
    usage = parse_res_usage(run_on_cubin("cuobjdump", ["-res-usage"], program.cubin or b""))
    for mangled, u in usage.items():
        if u.shared:
            if u.shared < reserved:
                raise RuntimeError(f"{mangled}: SHARED {u.shared} on {arch}, less than the reserved {reserved}")
            usage[mangled] = Usage(u.registers, u.stack, u.shared - reserved, u.local)
    return by_name_expression(program, usage)


# ---------------------------------------------------------------------------------------------------------
# Instructions and loops

SASS_INSTRUCTION_BYTES = 16  # every SASS instruction of sm_70 and newer; nvdisasm's branch targets are byte offsets
MATRIX = ("HMMA", "IMMA", "DMMA", "HGMMA")
FMA = ("FFMA", "DFMA", "HFMA2")   # the SIMT multiply-adds a convolution's main loop is made of
MIN_FMA_LOOP = 4   # fewer FMAs make no convolution loop: a bias add, or HFMA2 used to move a constant
# The instruction mix's classes, by mnemonic (anything else is "other": conversions, moves, special registers...).
CLASSES = {
    "matrix": MATRIX,
    "fma": FMA,
    "float": ("FADD", "FMUL", "DADD", "DMUL", "HADD2", "HMUL2", "FMNMX", "FSETP", "DSETP", "HSETP2", "FSEL",
              "MUFU"),
    "global_load": ("LDG", "LDGSTS", "LD"),
    "global_store": ("STG", "ST", "RED", "ATOM", "ATOMG"),
    "shared_load": ("LDS", "LDSM"),
    "shared_store": ("STS", "ATOMS"),
    "local": ("LDL", "STL"),
    "integer": ("IMAD", "IADD3", "IADD", "LOP3", "SHF", "LEA", "ISETP", "IMNMX", "SEL", "PRMT", "IABS", "SGXT",
                "BMSK", "POPC", "FLO", "BREV", "IMUL", "LOP", "SHL", "SHR", "IDP", "VIADD", "VIMNMX", "PLOP3"),
    "barrier": ("BAR", "DEPBAR", "WARPSYNC", "MEMBAR", "LDGDEPBAR", "ARRIVES", "SYNCS"),
    "branch": ("BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "JMP", "BRX", "BREAK", "BPT"),
}
CLASS_OF = {op: name for name, ops in CLASSES.items() for op in ops}


def mnemonic(opcode: str) -> str:
    """'HMMA.16816.F32' -> 'HMMA'."""
    return opcode.split(".")[0]


def instruction_mix(opcodes: Counter) -> dict[str, int]:
    """{class: instructions} of a Counter of mnemonics (CLASSES; the rest under "other")."""
    mix: Counter = Counter()
    for op, n in opcodes.items():
        mix[CLASS_OF.get(op, "other")] += n
    return dict(mix)


def disassemble(program: Program, lines: bool = False) -> dict[str, list[dict]]:
    """{name expression: its SASS instructions} (nvdisasm -json: each {"opcode", "operands", ...}; read-only, shared
    between callers of the same cubin).  lines=True (a cubin compiled with -lineinfo): each instruction also has
    "source": (file name as NVRTC saw it, line), or None where the line table has none."""
    return by_name_expression(program, _disassemble_cubin(program.cubin or b"", lines))


@functools.lru_cache(maxsize=1)
def _disassemble_cubin(cubin: bytes, lines: bool = False) -> dict[str, list[dict]]:
    """{mangled name: SASS instructions} of the last cubin asked about, memoised: several tests in a row read one
    cubin's instructions, and nvdisasm -json of depthwise.cu's few hundred kernels takes tens of seconds (one
    listing kept: a large one holds hundreds of MB).  With lines, nvdisasm -g: an instruction carries
    "source-file-id" and "source-line" where its line differs from the previous instruction's (the line table is
    in address order), so each one without them keeps the line before it."""
    listing = json.loads(run_on_cubin("nvdisasm", ["-json", "-g"] if lines else ["-json"], cubin))
    functions = {f["function-name"]: f.get("sass-instructions", []) for f in listing[1]}
    if lines:
        table = listing[2] if len(listing) > 2 and isinstance(listing[2], dict) else {}
        files = [entry.get("file") for entry in table.get("files", [])]
        for instructions in functions.values():
            current = None
            for instruction in instructions:
                if "source-line" in instruction:
                    index = instruction.get("source-file-id", -1)
                    current = (files[index] if 0 <= index < len(files) else None, instruction["source-line"])
                instruction["source"] = current
    return functions


def sass_opcodes(program: Program, full: bool = False) -> dict[str, Counter]:
    """{name expression: Counter of its SASS instructions} of a compiled kernel file, by mnemonic ("HMMA",
    "FFMA", "LDS"), or with full=True by the whole opcode ("HMMA.16816.F32")."""
    return {name: Counter(i["opcode"] if full else mnemonic(i["opcode"]) for i in instructions)
            for name, instructions in disassemble(program).items()}


def branch_target(instruction: dict) -> int | None:
    """The instruction index a branch jumps to (its last operand, a byte offset "0x..."), or None where that is no
    address: a register target, no operands, or BSYNC's convergence barrier ("B1", which reads as hex too: taken
    for a jump to instruction 11, it made the whole prologue a "loop" that executed.py counted once per trip)."""
    operand = instruction.get("operands", "").split(",")[-1].strip()
    if not operand.startswith("0x"):
        return None
    return int(operand, 16) // SASS_INSTRUCTION_BYTES


def loops(instructions: list[dict]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of every loop: a backward branch at `last` to `first`."""
    found = []
    for end, instruction in enumerate(instructions):
        if mnemonic(instruction["opcode"]) != "BRA":
            continue
        start = branch_target(instruction)
        if start is not None and start < end:
            found.append((start, end))
    return found


def _count(opcodes: list[str], names: tuple) -> int:
    return sum(op in names for op in opcodes)


def main_loop_span(instructions: list[dict]) -> tuple[str, tuple[int, int]] | None:
    """(rule, (first, last) instruction) of the loop that holds a kernel's main work, or None for a kernel
    without loops:

    - "matrix": the smallest loop holding a matrix instruction (HMMA): for the tensor-core kernels one K chunk of
      tc_block's main loop;
    - "fma": else the loop with the most FFMA/DFMA/HFMA2 of its own (not counting loops nested in it; ties: the
      smaller), if it has at least MIN_FMA_LOOP of them, for the SIMT kernels;
    - "memory": else (elementwise kernels, reductions) the smallest loop with the most global loads and stores.
    """
    opcodes = [mnemonic(i["opcode"]) for i in instructions]
    spans = loops(instructions)
    if not spans:
        return None

    def own(span, names):
        inner = [s for s in spans if s != span and span[0] <= s[0] and s[1] <= span[1]]
        covered = {i for s in inner for i in range(s[0], s[1] + 1)}
        return sum(opcodes[i] in names for i in range(span[0], span[1] + 1) if i not in covered)

    matrix = [s for s in spans if _count(opcodes[s[0]:s[1] + 1], MATRIX)]
    if matrix:
        return "matrix", min(matrix, key=lambda s: s[1] - s[0])
    best = max(spans, key=lambda s: (own(s, FMA), -(s[1] - s[0])))
    if own(best, FMA) >= MIN_FMA_LOOP:
        return "fma", best
    memory = CLASSES["global_load"] + CLASSES["global_store"]
    return "memory", max(spans, key=lambda s: (_count(opcodes[s[0]:s[1] + 1], memory), -(s[1] - s[0])))


def main_loop(instructions: list[dict], full: bool = False) -> tuple[str, Counter] | None:
    """(rule, Counter of mnemonics, or with full=True of whole opcodes) of `main_loop_span`'s loop, as one warp
    executes one trip of it (a static count: predicated-off instructions are counted too); None without loops."""
    found = main_loop_span(instructions)
    if found is None:
        return None
    rule, (first, last) = found
    return rule, Counter(i["opcode"] if full else mnemonic(i["opcode"]) for i in instructions[first:last + 1])


def main_loop_opcodes(program: Program) -> dict[str, Counter]:
    """{name expression: Counter of SASS mnemonics} of each kernel's innermost loop that issues HMMA (the "matrix"
    rule of `main_loop`); kernels without such a loop are left out."""
    result = {}
    for name, instructions in disassemble(program).items():
        found = main_loop(instructions)
        if found and found[0] == "matrix":
            result[name] = found[1]
    return result


# ---------------------------------------------------------------------------------------------------------
# Occupancy


@dataclass(frozen=True)
class SmLimits:
    """Per-SM allocation limits of an architecture (CUDA C Programming Guide, "Compute Capabilities" table)."""
    registers: int = 65536          # 32-bit registers per SM
    sub_partitions: int = 4         # the register file is split over the 4 warp schedulers
    register_unit: int = 256        # registers are allocated per warp in units of 256
    max_registers_per_thread: int = 255
    shared: int = 228 * 1024        # shared memory per SM (sm_90; sm_80: 164 KiB)
    reserved_shared_per_block: int = 1024
    max_blocks: int = 32
    max_warps: int = 64
    max_threads_per_block: int = 1024


SM_LIMITS = {"sm_90": SmLimits(), "sm_80": SmLimits(shared=164 * 1024)}


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    limited_by: str       # "registers", "shared memory", "blocks", "warps" (the smallest limit; ties: that order)
    registers_per_warp: int
    shared_per_block: int  # static + dynamic + reserved

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / 64


def occupancy(registers: int, threads: int, shared_bytes: int, arch: str = "sm_90") -> Occupancy:
    """Resident blocks and warps per SM of a kernel with `registers` per thread, blocks of `threads` and
    `shared_bytes` (static + dynamic) per block; ValueError for a block that cannot run at all."""
    limits = SM_LIMITS[arch]
    warps = -(-threads // 32)
    if threads > limits.max_threads_per_block or registers > limits.max_registers_per_thread:
        raise ValueError(f"occupancy: {threads} threads x {registers} registers cannot launch on {arch}")
    per_warp = -(-max(registers, 1) * 32 // limits.register_unit) * limits.register_unit
    per_partition = limits.registers // limits.sub_partitions
    warps_by_registers = (per_partition // per_warp) * limits.sub_partitions
    shared = shared_bytes + limits.reserved_shared_per_block
    candidates = {
        "registers": warps_by_registers // warps,
        "shared memory": limits.shared // shared,
        "blocks": limits.max_blocks,
        "warps": limits.max_warps // warps,
    }
    limited_by = min(candidates, key=lambda k: candidates[k])
    blocks = candidates[limited_by]
    if blocks == 0:
        raise ValueError(f"occupancy: a block of {threads} threads, {registers} registers and {shared_bytes} B of "
                         f"shared memory does not fit an {arch} SM ({limited_by})")
    return Occupancy(blocks, blocks * warps, limited_by, per_warp, shared)


# ---------------------------------------------------------------------------------------------------------
# Per instantiation, cached


@dataclass
class KernelSass:
    """What the model needs of one instantiation's SASS."""
    name: str
    arch: str
    registers: int
    stack: int
    local: int
    static_shared: int
    instructions: int                 # the whole kernel, static
    body_instructions: int            # those up to its last EXIT: without the cold subroutines placed after it
                                      # (e.g. integer division's slow path), which run only when called
    loop_rule: str | None             # main_loop's rule, None: no loop
    loop: dict = field(default_factory=dict)   # {mnemonic: count} of one trip of the main loop
    loop_mix: dict = field(default_factory=dict)   # {class: count} of the same
    loop_memory: dict = field(default_factory=dict)   # {whole opcode: count} of its memory instructions
                                                       # ("LDG.E.U16", "STS.128"): their widths
    code: list = field(default_factory=list)   # up to the last EXIT, one [whole opcode, "file:line" of the kernel
                                               # source or "", predicated, branch target index or -1, a global
                                               # load waited for in its block (`used_before_branch`)] each
                                               # (`code_of`: what benchmarks.executed combines with run counts)

    @property
    def loop_instructions(self) -> int:
        return sum(self.loop.values())

    @property
    def spills(self) -> bool:
        return bool(self.stack or self.local)

    def to_dict(self) -> dict:
        return {**asdict(self), "loop_instructions": self.loop_instructions}


CACHE_FORMAT = 5   # part of the cache key: bump it when KernelSass changes


def cache_dir() -> Path:
    return Path(os.environ.get("CUPYCONV_SASS_CACHE") or Path.home() / ".cache" / "cupyconv-sass")


def _key(filename: str, arch: str, name: str) -> str:
    from cupyconv import _device
    compiler = nvrtc(ARCHES[arch])
    text = repr((CACHE_FORMAT, compiler.version, _device.kernel_source(filename), options_for(arch, filename), arch,
                 name))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# The model's compile adds NVRTC's -lineinfo (a line table for `code`'s sources): it leaves the instructions as they
# are (tests/test_executed.py compares them with and without it).
LINEINFO = "-lineinfo"


def compile_names(filename: str, arch: str, names: list[str], lineinfo: bool = False) -> Program:
    """One NVRTC program of raw_kernels/<filename> holding `names`, compiled for arch (with a line table where
    lineinfo); RuntimeError on failure."""
    from cupyconv import _device
    program = nvrtc(ARCHES[arch]).compile(_device.kernel_source(filename), filename, list(names),
                                          options_for(arch, filename) + [LINEINFO] * lineinfo)
    if not program.ok or not program.cubin:
        raise RuntimeError(f"NVRTC could not compile {filename} for {arch}:\n{program.log}")
    return program


def source_lines(filename: str, directory: Path | None = None) -> list[str]:
    """"file:line" of every line of `_device.kernel_source(filename)` (index 0: its first line), the file named
    relative to raw_kernels/ (or `directory`) as the emulator's counters name their sites: the text NVRTC compiles
    inlines the local headers, so its line numbers are not the files'.  Built by the same substitution as
    kernel_source (checked, for raw_kernels/)."""
    from cupyconv import _device
    check = directory is None
    directory = _device.kernel_dir() if directory is None else Path(directory)
    include = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', flags=re.M)

    def expand(name: str, seen: set) -> tuple[str, list]:
        if name in seen:
            return "", []
        seen.add(name)
        text = (directory / name).read_text()
        line_at = [0] * (len(text) + 1)   # the 1-based line of each character of this file
        line = 1
        for i, c in enumerate(text):
            line_at[i] = line
            line += c == "\n"
        line_at[len(text)] = line
        out, origin, end = [], [], 0
        for match in include.finditer(text):
            out.append(text[end:match.start()])
            origin += [(name, line_at[i]) for i in range(end, match.start())]
            inner, inner_origin = expand(match.group(1), seen)
            out.append(inner)
            origin += inner_origin
            end = match.end()
        out.append(text[end:])
        origin += [(name, line_at[i]) for i in range(end, len(text))]
        return "".join(out), origin

    text, origin = expand(filename, set())
    if check and text != _device.kernel_source(filename):
        raise RuntimeError(f"source_lines({filename!r}) does not rebuild _device.kernel_source's text")
    result, start = [], 0
    for i, c in enumerate(text if text.endswith("\n") else text + "\n"):
        if c == "\n":
            where = origin[start] if start < len(origin) else origin[-1]
            result.append(f"{where[0]}:{where[1]}")
            start = i + 1
    return result


def code_of(instructions: list[dict], filename: str, lines: list[str]) -> list[list]:
    """`KernelSass.code` of one kernel's instructions from `disassemble(program, lines=True)`: up to its last EXIT,
    [whole opcode, "file:line" (`lines` of the kernel file) or "" (no line, or a line of another file: CUDA's own
    headers), predicated (1: guarded by a predicate other than PT), the index of a branch's target or -1, 1 for a
    global load whose result the same basic block reads (`used_before_branch`)]."""
    exits = [i for i, instruction in enumerate(instructions) if mnemonic(instruction["opcode"]) == "EXIT"]
    body = instructions[:exits[-1] + 1] if exits else instructions
    code = []
    for instruction in body:
        source = instruction.get("source")
        site = ""
        if source and source[0] == filename and 1 <= source[1] <= len(lines):
            site = lines[source[1] - 1]
        predicate = instruction.get("predicate", "")
        target = branch_target(instruction) if CLASS_OF.get(mnemonic(instruction["opcode"])) == "branch" else None
        code.append([instruction["opcode"], site, int(bool(predicate) and predicate not in ("@PT",)),
                     -1 if target is None else target, 0])
    for i, instruction in enumerate(body):
        if mnemonic(instruction["opcode"]) == "LDG":
            code[i][4] = int(used_before_branch(body, i))
    return code


_REGISTER = re.compile(r"^R(\d+)")
# Mnemonics whose first operand is read, not written (stores, reductions, branches, barriers)
_NO_DESTINATION = ("ST", "STG", "STS", "STL", "RED", "BRA", "BSSY", "BSYNC", "BAR", "EXIT", "DEPBAR", "WARPSYNC",
                   "NOP", "CALL", "RET", "BREAK", "MEMBAR", "ARRIVES", "SYNCS")


def used_before_branch(body: list[dict], load: int) -> bool:
    """Whether a global load's destination registers are read by a later instruction before the next branch or
    EXIT (and before being overwritten): the warp then waits for the load inside its own basic block, once per
    execution of it (a load whose use lies past a branch may be issued with others first)."""
    first = body[load].get("operands", "").split(",")[0]
    match = _REGISTER.match(first)
    if not match:
        return False
    width = {"64": 2, "128": 4}
    count = next((width[p] for p in body[load]["opcode"].split(".") if p in width), 1)
    registers = {f"R{int(match.group(1)) + k}" for k in range(count)}
    pattern = re.compile(r"\b(" + "|".join(sorted(registers)) + r")\b")
    for instruction in body[load + 1:]:
        op = mnemonic(instruction["opcode"])
        operands = instruction.get("operands", "").split(",")
        sources = operands if op in _NO_DESTINATION else operands[1:]
        if any(pattern.search(operand) for operand in sources):
            return True
        if CLASS_OF.get(op) == "branch":
            return False
        if op not in _NO_DESTINATION and pattern.fullmatch(operands[0].split(".")[0] if operands else ""):
            return False   # overwritten first
    return False


def analyse_program(program: Program, arch: str, filename: str | None = None) -> dict[str, KernelSass]:
    """{name expression: KernelSass} of every kernel of a compiled program (with `code` where the program was
    compiled with -lineinfo from raw_kernels/<filename>)."""
    usage = resource_usage(program, arch)
    listing = disassemble(program, lines=filename is not None)
    lines = source_lines(filename) if filename is not None else []
    result = {}
    for name, instructions in listing.items():
        u = usage[name]
        found = main_loop(instructions, full=True)
        full = found[1] if found else Counter()
        loop = Counter({})
        for opcode, n in full.items():
            loop[mnemonic(opcode)] += n
        memory = {op: n for op, n in full.items() if CLASS_OF.get(mnemonic(op), "").startswith(("global", "shared"))}
        exits = [i for i, instruction in enumerate(instructions) if mnemonic(instruction["opcode"]) == "EXIT"]
        body = exits[-1] + 1 if exits else len(instructions)
        result[name] = KernelSass(name, arch, u.registers, u.stack, u.local, u.shared, len(instructions), body,
                                  found[0] if found else None, dict(loop), instruction_mix(loop), memory,
                                  code_of(instructions, filename, lines) if filename is not None else [])
    return result


def analyse(filename: str, names, arch: str = "sm_90") -> dict[str, KernelSass]:
    """{name: KernelSass} of these instantiations of raw_kernels/<filename>: from the disk cache where it has
    them, the others compiled together in one program (then cached).  ToolMissing without the wheels."""
    names = sorted(set(names))
    directory = cache_dir()
    keys = {name: _key(filename, arch, name) for name in names}
    result, missing = {}, []
    for name in names:
        path = directory / f"{keys[name]}.json"
        try:
            result[name] = KernelSass(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            missing.append(name)
    if missing:
        fresh = analyse_program(compile_names(filename, arch, missing, lineinfo=True), arch, filename)
        directory.mkdir(parents=True, exist_ok=True)
        for name in missing:
            result[name] = fresh[name]
            path = directory / f"{keys[name]}.json"
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(asdict(fresh[name])))
            partial.replace(path)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sass", description=__doc__.split("\n\n")[0])
    parser.add_argument("filename", help="a raw_kernels/ file, e.g. conv.cu")
    parser.add_argument("--arch", default="sm_90", choices=sorted(SM_LIMITS))
    parser.add_argument("--names", default="", help="';'-separated name expressions (default: every listed one)")
    args = parser.parse_args(argv)
    from cupyconv import _device
    names = [n.strip() for n in args.names.split(";") if n.strip()] or \
        [n for f, n in _device.all_instantiations() if f == args.filename]
    for name, k in analyse(args.filename, names, args.arch).items():
        mix = " ".join(f"{c} {n}" for c, n in sorted(k.loop_mix.items(), key=lambda item: -item[1]))
        print(f"{name:56} reg {k.registers:3} shared {k.static_shared:6} spill {int(k.spills)}  loop "
              f"({k.loop_rule}) {k.loop_instructions:5}: {mix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
