"""Compile one kernel source file for the CPU with g++, cached on disk by a hash of everything that goes in.

One g++ compile and link per (source file, mode) builds a shared library with, for each name expression, the
extern "C" functions emu_launch_<i>, emu_signature_<i> and emu_max_threads_<i> (see emu_runtime.h).  Libraries
live in $CUPYCONV_EMULATOR_CACHE (default ~/.cache/cupyconv-emulator), one directory per key, each written under
a temporary name and renamed into place, with a lock file so that parallel pytest workers build a key once.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
DYNAMIC_SHARED_CAPACITY = 227 * 1024  # the largest opt-in shared memory of any GPU we target (sm_90)
PRUNE_AFTER_S = 7 * 24 * 3600
FORMAT = "2"  # bump when the generated code or meta.json changes in a way the hashed inputs do not show

CXX = os.environ.get("CXX", "g++")
# -O0: a file of ~200 instantiations compiles in a third of -O1's time (4 s against 12 s of CPU; 9 s against
# 18 s under ASan), and the small launches of the tests run about as fast, since switching fibers dominates.
# CUPYCONV_EMULATOR_OPT=-O1 (or -O2) to choose another level.
OPT_LEVEL = os.environ.get("CUPYCONV_EMULATOR_OPT", "-O0")
# Bounds of fixed-size arrays (static __shared__ ones included, which live in TLS where ASan puts no redzones),
# signed overflow and the alignment of every access through a typed pointer (x86 loads a misaligned float4, a
# GPU faults) are checked in every build; emu_runtime.h turns a failed check into a failed launch.
UB_CHECKS = "bounds,signed-integer-overflow,alignment"
# -ffunction-sections: each function's code and relocations stand apart in the object file, which is how the
# static shared memory of a kernel and of every helper it calls is found (static_shared_sizes).
# -fno-gnu-unique: a `__shared__` array is a thread_local static of a template kernel, which g++ would bind
# STB_GNU_UNIQUE, and glibc binds such a symbol once per process whatever RTLD_LOCAL says: a second library of the
# same kernel file (the profile build after the plain one, or another file's copy of a header's helper) would then
# use the first library's storage, outside its own TLS block, so its blocks' shared memory would be neither
# poisoned nor counted.
BASE_FLAGS = ("-std=c++17", OPT_LEVEL, "-fno-strict-aliasing", "-fPIC", "-ffunction-sections", "-fno-gnu-unique",
              "-shared",
              "-Wl,-z,defs", f"-DEMU_DYNAMIC_SHARED_CAPACITY={DYNAMIC_SHARED_CAPACITY}")
PLAIN_FLAGS = (f"-fsanitize={UB_CHECKS}",)
# The plain build of a file that uses cp.async: ThreadSanitizer's instrumentation, linked without its runtime, calls
# emu_runtime.h's hooks before every load and store (not around every call, unlike the profile build), which check
# generic shared-memory accesses against the cp.async copies in flight and the launch's dynamic size; -g1 (line
# tables) lets a failure name its file:line (_device.py, with addr2line).  It costs about a fifth more g++ time and
# a quarter to a third more run time (implicit_gemm.cu: 23 -> 28 CPU s to compile; tests/test_patch_igemm.py
# 9-11 -> 12.5-13.5 CPU s in the test process), so files without cp.async keep the plain flags.
CHECKED_FLAGS = (f"-fsanitize=thread,{UB_CHECKS}", "--param=tsan-instrument-func-entry-exit=0", "-g1")
# ASan for global memory (arguments copied to exact-size heap buffers) and dynamic shared memory (poisoned
# past the launch's size); -g1 gives its reports file:line.
ASAN_FLAGS = (f"-fsanitize=address,{UB_CHECKS}", "-fno-omit-frame-pointer", "-g1")
# The profile build (memory counters, include/emu_counters.h): ThreadSanitizer's instrumentation of every load and
# store, compiled in but linked without its runtime (the emulator defines the hooks); -g for the line tables and
# inlining records that map an access to its file:line (profile.py, with addr2line).  Not with ASan: g++ refuses
# address and thread together.
PROFILE_FLAGS = (f"-fsanitize=thread,{UB_CHECKS}", "-g", "-DEMU_PROFILE=1")


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("CUPYCONV_EMULATOR_CACHE") or Path.home() / ".cache" / "cupyconv-emulator")


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"emulator: cannot run the C++ compiler {CXX!r}: {exc}") from exc


def expand_source(directory: Path, filename: str) -> str:
    """The file with its local #include "..." lines inlined (what the compiler will see of the kernel dir)."""
    def expand(name: str, seen: set) -> str:
        if name in seen:
            return ""
        seen.add(name)
        path = directory / name
        if not path.is_file():  # a system or stub header: hashed with the emulator's own files
            return f'#include "{name}"\n'
        text = path.read_text()
        return re.sub(r'^\s*#\s*include\s+"([^"]+)"\s*$', lambda m: expand(m.group(1), seen), text, flags=re.M)

    return expand(filename, set())


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def dynamic_shared_names(source_text: str) -> list[str]:
    """Names declared `extern __shared__ T name[];`: each is aliased to the emulator's dynamic buffer."""
    pattern = r"\bextern\s+__shared__\b[^;{}]*?\b([A-Za-z_]\w*)\s*\[\s*\]\s*;"
    return sorted(set(re.findall(pattern, _strip_comments(source_text))) - {"emu_dynamic_shared"})


def launch_bounds(source_text: str) -> dict[str, str]:
    """{kernel: the first argument of its __launch_bounds__ (max threads per block), as written}.

    The expression is left to g++ to evaluate in the generated launcher (see launcher_source), where the file's
    -D options and its own macros and constants are defined: TC_THREADS resolves as NVRTC would resolve it."""
    text = _strip_comments(source_text)
    bounds = {}
    for match in re.finditer(r"\b__launch_bounds__\s*\(", text):
        depth, end, comma = 1, match.end(), None
        while depth:  # to the closing parenthesis, noting the first comma outside nested ones
            c = text[end]
            depth += (c == "(") - (c == ")")
            if c == "," and depth == 1 and comma is None:
                comma = end
            end += 1
        declared = re.match(r"[^;{}()]*?(\w+)\s*\(", text[end:])  # the name of the function it qualifies
        if declared:
            bounds[declared.group(1)] = text[match.end():comma if comma is not None else end - 1].strip()
    return bounds


def launcher_source(source: str, names: list[str], bounds: dict[str, str]) -> str:
    lines = [f"// Generated by tests/emulator: launchers for {source}.",
             f'#include "{source}"', '#include "emu_runtime.h"', ""]
    for i, name in enumerate(names):
        kernel = f"(&{name})"
        # 0: no __launch_bounds__ (CUDA's 1024 threads per block apply)
        bound = bounds.get(re.match(r"\s*([\w:]+)", name).group(1), "0")
        lines += [
            f"// {name}",
            f'extern "C" int emu_launch_{i}(const unsigned* grid, const unsigned* block, unsigned long long shared,',
            f"                               void** args, const long long* extents) {{",
            f"  return emu::launch({kernel}, grid, block, shared, args, extents);",
            "}",
            f'extern "C" const char* emu_signature_{i}() {{ return emu::signature({kernel}); }}',
            f'extern "C" long long emu_max_threads_{i}() {{ return (long long)({bound}); }}',
            "",
        ]
    return "\n".join(lines)


def dynamic_shared_source(names: list[str]) -> str:
    # A translation unit of its own: the kernels declare these arrays with their own element types, which
    # could not share a file with these byte-array definitions.
    lines = ["// Generated by tests/emulator: the dynamic shared memory buffer and its `extern __shared__` names.",
             "alignas(128) thread_local unsigned char emu_dynamic_shared[EMU_DYNAMIC_SHARED_CAPACITY];"]
    lines += [f'extern thread_local unsigned char {n}[EMU_DYNAMIC_SHARED_CAPACITY] '
              f'__attribute__((alias("emu_dynamic_shared")));' for n in names]
    return "\n".join(lines) + "\n"


def _readelf(*args: str) -> str | None:
    try:
        return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def static_shared_sizes(obj: Path, count: int) -> dict[int, int]:
    """{i: bytes of static __shared__ memory of the kernel launched by emu_launch_<i>} from an object file built
    with -ffunction-sections.

    On a GPU a block holds every __shared__ variable its kernel can reach: its own, those of the helper
    functions it calls (inlined or not, at any depth) and those at file scope that any of them uses.  Here they
    are thread_local variables (prelude.h), and a function's section has a relocation naming each one it uses
    and each function it calls; following the calls from emu_launch_<i> (the engine, which uses none, and the
    kernel) collects them.  Only code is followed: data sections hold no calls of device code, and .rodata
    holds the jump tables of every function."""
    symbols, sections = _readelf("-s", str(obj)), _readelf("-S", str(obj))
    relocations = _readelf("-r", str(obj))
    if symbols is None or sections is None or relocations is None:
        return {}  # without binutils the static shared memory goes uncounted
    section_names = dict(re.findall(r"^\s*\[\s*(\d+)\]\s+(\S+)", sections, flags=re.M))
    section_of, tls_size = {}, {}  # symbol -> its section's name; TLS symbol -> size
    for line in symbols.splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[6].isdigit():
            continue  # a header, or an undefined symbol (libc, __tls_get_addr, `extern __shared__` names)
        section_of[parts[7]] = section_names.get(parts[6])
        if parts[3] == "TLS" and not parts[7].startswith("_ZGV"):  # not the guard of a class-type array's init
            tls_size[parts[7]] = int(parts[2], 0) if parts[2].startswith("0x") else int(parts[2])
    uses: dict[str, set] = {}  # code section -> the symbols (or section names) its relocations name
    for block in relocations.split("Relocation section '.rela")[1:]:
        target, _, body = block.partition("'")
        uses[target] = set(re.findall(r"^\s*[0-9a-f]+\s+[0-9a-f]+\s+\S+\s+[0-9a-f]+\s+(\S+)", body, flags=re.M))
    result = {}
    for i in range(count):
        todo, seen, shared = [f".text.emu_launch_{i}"], set(), set()
        while todo:
            section = todo.pop()
            if section in seen:
                continue
            seen.add(section)
            for symbol in uses.get(section, ()):
                if symbol in tls_size:
                    shared.add(symbol)
                else:
                    callee = section_of.get(symbol, symbol)  # a section symbol is named by its section
                    if callee and callee.startswith(".text"):
                        todo.append(callee)
        result[i] = sum(tls_size[s] for s in shared)
    return result


def tls_guards(library: Path) -> list[list[int]]:
    """[offset, size] in the TLS block of each guard variable of a `__shared__` array of class type (a block-scope
    thread_local that g++ initialises once, checking its guard on every entry): not shared memory on a GPU, so the
    counters leave the guards' accesses out."""
    symbols = _readelf("-s", str(library)) or ""
    guards = set()
    for line in symbols.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "TLS" and parts[7].startswith("_ZGV"):
            guards.add((int(parts[1], 16), int(parts[2], 0) if parts[2].startswith("0x") else int(parts[2])))
    return [list(g) for g in sorted(guards)]


def build(kernel_dir: Path, source: str, names: list[str], asan: bool, defines=(), profile: bool = False
          ) -> tuple[Path, dict]:
    """Path of the compiled library for `names` of kernel_dir/source and its metadata; compiles if needed.
    defines: the file's -D options (cupyconv._device.compile_options), part of the key like every flag.
    profile: the build with memory counters (PROFILE_FLAGS), never with asan."""
    if asan and profile:
        raise BuildError("emulator: the profile (counters) build cannot also be the ASan build")
    kernel_dir = Path(kernel_dir).resolve()
    text = expand_source(kernel_dir, source)
    launcher = launcher_source(source, names, launch_bounds(text))
    dynamic = dynamic_shared_source(dynamic_shared_names(text))
    mode = "profile" if profile else "asan" if asan else "plain"
    plain = CHECKED_FLAGS if re.search(r"\bcp_async_", _strip_comments(text)) else PLAIN_FLAGS
    flags = list(BASE_FLAGS) + list({"profile": PROFILE_FLAGS, "asan": ASAN_FLAGS, "plain": plain}[mode])
    flags += list(defines)
    # The plain and profile builds link without ThreadSanitizer's runtime: include/emu_runtime.h defines its hooks.
    link_flags = flags if asan else list(BASE_FLAGS) + list(PLAIN_FLAGS)
    digest = hashlib.sha256()
    for part in (FORMAT, str(kernel_dir), source, text, launcher, dynamic, " ".join(flags), " ".join(link_flags),
                 compiler_version()):
        digest.update(part.encode() + b"\0")
    for header in sorted(INCLUDE_DIR.iterdir()):
        digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    key = f"{Path(source).stem}-{mode}-{digest.hexdigest()[:20]}"
    root = cache_root()
    final = root / key
    if not (final / "meta.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be compiling this very key
            if not (final / "meta.json").is_file():
                _compile(kernel_dir, source, names, launcher, dynamic, flags, link_flags, root, final)
                _prune(root, key)
    os.utime(final)  # marks it as used, for _prune
    return final / "lib.so", json.loads((final / "meta.json").read_text())


def _prune(root: Path, keep: str) -> None:
    """Remove the libraries of the same file and mode that nothing has used for a week (edits leave many)."""
    stem_and_mode = keep.rsplit("-", 1)[0] + "-"
    for entry in root.glob(stem_and_mode + "*"):
        try:
            if entry.is_dir() and entry.name != keep and time.time() - entry.stat().st_mtime > PRUNE_AFTER_S:
                shutil.rmtree(entry, ignore_errors=True)
                (root / f"{entry.name}.lock").unlink(missing_ok=True)
        except OSError:
            pass


def _compile(kernel_dir, source, names, launcher, dynamic, flags, link_flags, root: Path, final: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        (work / "launchers.cpp").write_text(launcher)
        (work / "dyn_shared.cpp").write_text(dynamic)
        # Compiled, then linked: static_shared_sizes reads the object file.
        for command in ([CXX, *flags, "-I", str(INCLUDE_DIR), "-I", str(kernel_dir), "-include", "prelude.h", "-c",
                         "launchers.cpp", "dyn_shared.cpp"],
                        [CXX, *link_flags, "-o", "lib.so", "launchers.o", "dyn_shared.o"]):
            result = subprocess.run(command, capture_output=True, text=True, cwd=work)
            if result.returncode != 0:
                raise BuildError(f"emulator: g++ failed on {kernel_dir / source}:\n{result.stderr[-20000:]}")
        shared = static_shared_sizes(work / "launchers.o", len(names))
        meta = {"source": source, "names": names, "static_shared": {names[i]: n for i, n in shared.items()},
                "tls_guards": tls_guards(work / "lib.so")}
        (work / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(work, final)  # atomic: readers see a complete directory or none
        except OSError:
            if not (final / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
