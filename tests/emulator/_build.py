"""Compile one kernel source file for the CPU with g++, cached on disk by a hash of everything that goes in.

One g++ call per (source file, mode) builds a shared library with, for each name expression, the extern "C"
functions emu_launch_<i>, emu_signature_<i> and emu_symbol_<i> (see emu_runtime.h).  Libraries live in
$CUPYCONV_EMULATOR_CACHE (default ~/.cache/cupyconv-emulator), one directory per key, each written under a
temporary name and renamed into place, with a lock file so that parallel pytest workers build a key once.
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
FORMAT = "1"  # bump when the generated code changes in a way the hashed inputs do not show

CXX = os.environ.get("CXX", "g++")
# -O0: a file of ~200 instantiations compiles in a third of -O1's time (4 s against 12 s of CPU; 9 s against
# 18 s under ASan), and the small launches of the tests run about as fast, since switching fibers dominates.
# CUPYCONV_EMULATOR_OPT=-O1 (or -O2) to choose another level.
OPT_LEVEL = os.environ.get("CUPYCONV_EMULATOR_OPT", "-O0")
# Bounds of fixed-size arrays (static __shared__ ones included, which live in TLS where ASan puts no redzones),
# signed overflow and the alignment of every access through a typed pointer (x86 loads a misaligned float4, a
# GPU faults) are checked in every build; emu_runtime.h turns a failed check into a failed launch.
UB_CHECKS = "bounds,signed-integer-overflow,alignment"
BASE_FLAGS = ("-std=c++17", OPT_LEVEL, "-fno-strict-aliasing", "-fPIC", "-shared", "-Wl,-z,defs",
              f"-DEMU_DYNAMIC_SHARED_CAPACITY={DYNAMIC_SHARED_CAPACITY}")
PLAIN_FLAGS = (f"-fsanitize={UB_CHECKS}",)
# ASan for global memory (arguments copied to exact-size heap buffers) and dynamic shared memory (poisoned
# past the launch's size); -g1 gives its reports file:line.
ASAN_FLAGS = (f"-fsanitize=address,{UB_CHECKS}", "-fno-omit-frame-pointer", "-g1")


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
            f'extern "C" const char* emu_symbol_{i}() {{ return emu::symbol(reinterpret_cast<void*>({kernel})); }}',
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


def _tls_symbol_sizes(library: Path) -> dict[str, int]:
    """Sizes of the library's thread-local symbols: its static __shared__ variables, by mangled name."""
    try:
        out = subprocess.run(["readelf", "-W", "-s", str(library)], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}  # without binutils the static shared memory limit goes unchecked
    sizes = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "TLS":
            size = int(parts[2], 16) if parts[2].lower().startswith("0x") else int(parts[2])
            sizes[parts[7]] = size
    return sizes


def build(kernel_dir: Path, source: str, names: list[str], asan: bool, defines=()) -> tuple[Path, dict]:
    """Path of the compiled library for `names` of kernel_dir/source and its metadata; compiles if needed.
    defines: the file's -D options (cupyconv._device.compile_options), part of the key like every flag."""
    kernel_dir = Path(kernel_dir).resolve()
    text = expand_source(kernel_dir, source)
    launcher = launcher_source(source, names, launch_bounds(text))
    dynamic = dynamic_shared_source(dynamic_shared_names(text))
    flags = list(BASE_FLAGS) + list(ASAN_FLAGS if asan else PLAIN_FLAGS) + list(defines)
    digest = hashlib.sha256()
    for part in (FORMAT, str(kernel_dir), source, text, launcher, dynamic, " ".join(flags), compiler_version()):
        digest.update(part.encode() + b"\0")
    for header in sorted(INCLUDE_DIR.iterdir()):
        digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    key = f"{Path(source).stem}-{'asan' if asan else 'plain'}-{digest.hexdigest()[:20]}"
    root = cache_root()
    final = root / key
    if not (final / "meta.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be compiling this very key
            if not (final / "meta.json").is_file():
                _compile(kernel_dir, source, names, launcher, dynamic, flags, root, final)
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


def _compile(kernel_dir, source, names, launcher, dynamic, flags, root: Path, final: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        (work / "launchers.cpp").write_text(launcher)
        (work / "dyn_shared.cpp").write_text(dynamic)
        command = [CXX, *flags, "-I", str(INCLUDE_DIR), "-I", str(kernel_dir), "-include", "prelude.h",
                   "-o", str(work / "lib.so"), str(work / "launchers.cpp"), str(work / "dyn_shared.cpp")]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"emulator: g++ failed on {kernel_dir / source}:\n{result.stderr[-20000:]}")
        meta = {"source": source, "names": names, "tls": _tls_symbol_sizes(work / "lib.so")}
        (work / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(work, final)  # atomic: readers see a complete directory or none
        except OSError:
            if not (final / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
