"""From a planner's decisions to `Device.launch`: kernel files, their signatures, arguments and grid sizes.

An op module declares its kernel file once::

    KERNELS = KernelFile("depthwise.cu", defines={"GENERIC_STRIP": 4, ...})

`defines` are the constants that Python planners and CUDA kernels must agree on.  They exist only here: every
compiler of the file (CuPy's NVRTC, the NVRTC check in the tests, the CPU emulator) gets them as `-D` options
from `compile_options()`, and the kernel file refuses to compile without them.

Kernels are launched by name with named arguments::

    KERNELS.launch(device, "depthwise_fwd", (k, s), dtype=x.dtype, index="int", grid=..., block=...,
                   window=spec, x=x, weight=weight, ..., has_bias=True)

The parameter list of each `__global__` template is read from the CUDA source itself, so the arguments are
ordered and converted (Python ints to the exact NumPy scalar type of the C parameter, e.g. numpy.int32 for
`int`) by the one declaration the compiler also sees.  Every argument is then checked by `argument_error`,
the same function the emulator uses on the signature it reads from the compiled binary.
"""
from __future__ import annotations

import contextlib
import functools
import math
import re
from dataclasses import dataclass, field

import numpy

from . import _device, settings
from ._arrays import compute_dtype, dtype_name
from ._spec import ConvSpec, ceil_div

INDEX_TYPES = ("int", "long long")
KERNEL_DTYPES = ("float16", "bfloat16", "float32", "float64")  # every kernel is instantiated for each
INT32_MAX = 2**31 - 1

# Grid sizes.  Kernels that loop over their units (grid-stride or block-stride loops) are launched with at
# most GRID_CAP blocks, enough to fill any current GPU; CUDA's own limits are MAX_GRID.
GRID_CAP = 65536
MAX_GRID = (2**31 - 1, 65535, 65535)
# The SMs the planners size waves of blocks for: a 132-SM H100 (the H200 has as many).  A shape-only constant, so
# that a plan never depends on the GPU it runs on; one place for every planner that counts waves.
PLAN_SMS = 132
ELEMENTWISE_BLOCK = 256

_C_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double"}
# C scalar type -> NumPy dtype name of the value a launch passes for it (CuPy passes scalars by their dtype).
_SCALAR_DTYPES = {"__half": "float16", "__nv_bfloat16": "bfloat16", "float": "float32", "double": "float64",
                  "bool": "bool", "signed char": "int8", "short": "int16", "int": "int32", "long long": "int64",
                  "unsigned char": "uint8", "unsigned short": "uint16", "unsigned int": "uint32",
                  "unsigned long long": "uint64"}


def c_type(dtype) -> str:
    """The CUDA C element type of a NumPy/CuPy dtype."""
    return _C_TYPES[dtype if isinstance(dtype, str) else dtype_name(dtype)]


def kernel_name(kernel: str, dtype, index: str, *constants) -> str:
    """The name expression of one instantiation, kernel<T, I, constants...>: e.g. kernel_name("patch_fwd",
    numpy.float32, "int", 4, 4, 3, 3) is "patch_fwd<float, int, 4, 4, 3, 3>"."""
    return f"{kernel}<{', '.join((c_type(dtype), index, *map(_constant, constants)))}>"


def _constant(value) -> str:
    """A template argument in C++: True -> 'true' (a bool template parameter), 3 -> '3'."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def index_type(*extents: int) -> str:
    """'int' when every flat index of every buffer fits in 32 bits, else 'long long' (64-bit)."""
    return "int" if max(extents, default=0) <= INT32_MAX else "long long"


def element_strides(a) -> list[int]:
    """Strides of a NumPy/CuPy array in elements (both libraries keep them in bytes)."""
    return [s // a.itemsize for s in a.strides]


def extent(a) -> int:
    """One past the largest flat element offset any index of `a` can reach from its first element."""
    return 1 + sum(abs(s) * (d - 1) for s, d in zip(element_strides(a), a.shape)) if a.size else 0


def stride_args(prefix: str, a, dims) -> dict:
    """{<prefix>_stride_<dim>: element stride} for the dims of `a`, named by `dims` ("nchw": one letter each)."""
    return {f"{prefix}_stride_{d}": s for d, s in zip(dims, element_strides(a), strict=True)}


def batch_view(device, a):
    """a (..., X, Y, Z) as a 5-d view (outer, inner, X, Y, Z) of the same memory, for image q = (q // inner,
    q % inner): what the kernels that read a batch through two strides take (patch_offset in the .cu files).
    Leading dims of size 1 are dropped and a dim merges into the next one when their strides allow;
    a batch that still needs three or more strides is copied to a contiguous array (`device.ascontiguous`)."""
    dims = []
    for size, stride in zip(a.shape[:-3], element_strides(a)[:-3]):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:
            dims[-1] = (dims[-1][0] * size, stride)
        else:
            dims.append((size, stride))
    if len(dims) > 2:
        a = device.ascontiguous(a)
        dims = dims[:1]
    n = math.prod(a.shape[:-3])
    outer = dims[0][0] if len(dims) == 2 else 1
    return a.reshape(outer, n // outer, *a.shape[-3:])


def batch_args(prefix: str, view) -> dict:
    """The kernel arguments of a batch view: <prefix>_inner and the element strides (outer, inner, c, h, w)."""
    return {f"{prefix}_inner": view.shape[1], **stride_args(prefix, view, ("outer", "inner", "c", "h", "w"))}


def fast_divmod_magic(divisor: int) -> int:
    """The multiplier m of raw_kernels/common.cuh's FastDivmod(divisor, m), computed here so that a kernel's threads
    pay no 64-bit division for it: with l = ceil(log2 divisor), m = floor(2^32 (2^l - divisor) / divisor) + 1."""
    if not 1 <= divisor < 2**31:   # (not INT32_MAX, which tests lower to force 64-bit indices)
        raise ValueError(f"fast_divmod_magic: divisor {divisor} is outside 1 .. 2^31 - 1")
    shift = (divisor - 1).bit_length()
    return (((1 << shift) - divisor) << 32) // divisor + 1


def capped_grid(units: int) -> int:
    """Blocks for a kernel that loops over `units` units: one each, at most GRID_CAP."""
    return max(1, min(units, GRID_CAP))


def split_reduction(chunks: int, blocks: int, target_blocks: int, min_chunks: int, split_bytes: int) -> tuple[int, int]:
    """(splits, chunks per split) of a GEMM whose `blocks` output tiles share a reduction of `chunks` chunks
    until about `target_blocks` blocks run: each split at least `min_chunks` chunks, each with `split_bytes` of
    float32 partial sums within the workspace limit, at most MAX_GRID[2]; one split where nothing fits.  Chosen by
    the shapes only, never the SM count, so that the bits are the same on every run and every GPU."""
    splits = max(1, min(ceil_div(target_blocks, blocks), chunks // min_chunks,
                        settings.get_workspace_limit() // max(1, split_bytes), MAX_GRID[2]))
    per_split = ceil_div(chunks, splits)
    return ceil_div(chunks, per_split), per_split


def elementwise_launch(total: int, block: int = ELEMENTWISE_BLOCK):
    """(grid, block) for a grid-stride kernel over `total` items."""
    return (capped_grid(ceil_div(total, block)),), (block,)


# ---------------------------------------------------------------------------------------------------------
# Signatures


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # as declared, normalised: "const T*", "I", "int", "acc_t<T>*"


_KERNEL = re.compile(r"template\s*<[^{;]*?>\s*__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
                     r"(\w+)\s*\(([^)]*)\)\s*\{")


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def parse_signatures(source: str) -> dict[str, tuple[Param, ...]]:
    """{kernel: its parameters} for every `__global__` template of a CUDA source text."""
    signatures = {}
    for name, params in _KERNEL.findall(_strip_comments(source)):
        parsed = []
        for param in filter(None, (p.strip() for p in params.split(","))):
            declaration = re.sub(r"\b__restrict__\b", " ", param)
            match = re.fullmatch(r"(.*?)\s*\b(\w+)", declaration.strip(), flags=re.S)
            if match is None:
                raise ValueError(f"kernel {name}: cannot read the parameter {param!r} of its signature")
            type_ = re.sub(r"\s+", " ", match.group(1)).replace(" *", "*").strip()
            parsed.append(Param(match.group(2), type_))
        signatures[name] = tuple(parsed)
    return signatures


def resolve_type(declared: str, dtype, index: str) -> str:
    """The C type of a parameter in the instantiation for element dtype and index type: T, acc_t<T> and I
    replaced, e.g. "const T*" -> "const __half*", "acc_t<T>*" -> "float*", "I" -> "long long"."""
    resolved = declared.replace("acc_t<T>", c_type(compute_dtype(dtype)))
    resolved = re.sub(r"\bT\b", c_type(dtype), resolved)
    return re.sub(r"\bI\b", index, resolved)


def argument_error(c_type_: str, value) -> str | None:
    """Why `value` cannot be passed for a parameter of C type `c_type_`, or None when it can.

    Pointers take arrays (NumPy or CuPy) of exactly that element type (a uint16 array of raw bits for
    __nv_bfloat16, which NumPy lacks), writeable unless the pointer is const; scalars take NumPy scalars of
    exactly the matching type, since CuPy passes a scalar by its dtype without looking at the parameter.
    Shared by `KernelFile.launch` and the CPU emulator's check of the compiled signature.
    """
    if c_type_.endswith("*"):
        element = c_type_[:-1].removeprefix("const ").strip()
        if not hasattr(value, "shape") or not hasattr(value, "dtype") or isinstance(value, numpy.generic):
            return "pass an array"
        dtype = numpy.dtype(value.dtype)
        if dtype.name != _SCALAR_DTYPES.get(element) and not (element == "__nv_bfloat16" and dtype == numpy.uint16):
            return "the element types differ"
        # Only NumPy arrays can be read-only: CuPy's Flags has no `writeable` (c_contiguous, f_contiguous, owndata).
        read_only = isinstance(value, numpy.ndarray) and not value.flags.writeable
        if not c_type_.startswith("const ") and read_only:
            return "the kernel may write through it but the array is read-only"
        return None
    expected = _SCALAR_DTYPES.get(c_type_)
    if expected is None:
        return "a type that cannot be passed"
    name = "bfloat16" if expected == "bfloat16" else f"numpy.{numpy.dtype(expected).type.__name__}"
    if not isinstance(value, numpy.generic):
        return (f"scalars must be NumPy scalars of the parameter's exact type ({name}), since CuPy passes "
                f"whatever it gets without checking")
    if value.dtype.name != expected:
        return f"pass {name}"
    return None


_MISSING = object()

#: {(C pointer type, array type, dtype): whether a NumPy array} of the arrays that passed `argument_error` for that
#: pointer: another array of the same three passes too, but for a read-only NumPy array where the pointer is not
#: const (checked on every launch).
_ARRAYS_PASSING: dict = {}


@functools.lru_cache(maxsize=None)
def _scalar_type(c_type_: str):
    """(NumPy scalar type, (min, max) for an integer type or None) of a C scalar type."""
    dtype = numpy.dtype(_SCALAR_DTYPES[c_type_])
    if dtype.kind in "iu":
        info = numpy.iinfo(dtype)
        return dtype.type, (int(info.min), int(info.max))
    return dtype.type, None


def _scalar(c_type_: str, value, where: str):
    """value (a Python or NumPy number) as the NumPy scalar of exactly C type c_type_, range-checked."""
    scalar, bounds = _scalar_type(c_type_)
    if bounds is not None:
        if isinstance(value, (float, numpy.floating)) or int(value) != value:
            raise TypeError(f"{where}: `{c_type_}` needs an integer, got {value!r}")
        if not bounds[0] <= int(value) <= bounds[1]:
            raise OverflowError(f"{where}: {int(value)} does not fit the `{c_type_}` parameter")
        return scalar(int(value))
    return scalar(value)


# ---------------------------------------------------------------------------------------------------------
# Kernel files


@dataclass(frozen=True)
class KernelFile:
    """One raw_kernels/ file: its name, the compile-time constants it shares with the Python planner, and whether
    it uses instructions of sm_90a only (wgmma, raw_kernels/wgmma.cuh)."""
    filename: str
    defines: dict = field(default_factory=dict, hash=False)
    sm90a: bool = False

    def options(self) -> tuple[str, ...]:
        """The -D options that define this file's shared constants (part of every compile of it)."""
        return tuple(f"-D{name}={value}" for name, value in sorted(self.defines.items()))

    def arch_options(self, capability: int | None) -> tuple[str, ...]:
        """("-arch=sm_90a",) for an `sm90a` file compiled for a GPU of compute capability `capability` 90, else ().

        CuPy 14 appends its own -arch=sm_90 after these options (cupy/cuda/compiler.py,
        `_get_arch_for_options_for_nvrtc`, which reads the architecture as an int and cannot name sm_90a itself);
        NVRTC 12.9 and 13 take -arch=sm_90a with a later -arch=sm_90 for sm_90a, silently, so the file's
        `__CUDA_ARCH_FEAT_SM90_ALL` code is compiled, and CuPy's cache key holds the options, so that binary is an
        entry of its own.  Other capabilities keep CuPy's flag alone: an sm_90a binary runs on 9.0 GPUs only, and
        with two different architectures NVRTC warns and takes the last, CuPy's (tests/test_wgmma.py)."""
        return ("-arch=sm_90a",) if self.sm90a and capability == 90 else ()

    @functools.cached_property
    def signatures(self) -> dict[str, tuple[Param, ...]]:
        return parse_signatures(_device.kernel_source(self.filename))

    @functools.lru_cache(maxsize=None, typed=True)   # typed: the constant True is 'true', 1 is '1'
    def name(self, kernel: str, dtype, index: str, *constants) -> str:
        if kernel not in self.signatures:
            raise KeyError(f"{self.filename} has no __global__ template named {kernel!r}")
        return kernel_name(kernel, dtype, index, *constants)

    def arguments(self, kernel: str, dtype, index: str, window: ConvSpec | None = None, **args) -> list:
        """The positional arguments of `kernel` in the C order, from named ones.

        `window`: a ConvSpec whose window geometry (`ConvSpec.window_args`) fills the parameters of those names
        that `args` does not give.  Every parameter must be given, and every name in `args` must be one.

        Runs on every launch, so the common case is cheap: what an argument's check depends on is resolved once
        per instantiation (`_c_params`) or per (parameter type, array type, dtype) (`_ARRAYS_PASSING`); a value
        that does not take the fast path gets the full check (`argument_error`, `_scalar`) and its error.
        """
        params, names = self._c_params(kernel, dtype_name(dtype), index)
        if not names.issuperset(args):
            raise TypeError(f"{self.filename}: {kernel} has no parameter {', '.join(sorted(set(args) - names))} "
                            f"(parameters: {', '.join(name for name, *_ in params)})")
        values = {**window.window_args(), **args} if window is not None else args
        if not names <= values.keys():
            missing = [name for name, *_ in params if name not in values]
            raise TypeError(f"{self.filename}: {kernel}: no value for parameter {', '.join(missing)}")
        result = [None] * len(params)
        for i, (name, c_type_, pointer, scalar, bounds) in enumerate(params):
            value = values[name]
            if pointer:
                # Known: an array of this (C type, array type, dtype) passed before; True for a NumPy array, whose
                # writeability is checked on every launch where the kernel may write through the pointer.
                try:
                    numpy_array = _ARRAYS_PASSING[c_type_, type(value), value.dtype]
                    known = not (numpy_array and pointer == "writes" and not value.flags.writeable)
                except (AttributeError, KeyError, TypeError):   # no dtype, not seen, an unhashable dtype
                    known = False
                if not known:
                    error = argument_error(c_type_, value)
                    if error:
                        raise TypeError(f"{self.filename}: {kernel}: parameter {name} is `{c_type_}`: {error}")
                    with contextlib.suppress(TypeError):   # an unhashable dtype: checked every time
                        _ARRAYS_PASSING[c_type_, type(value), value.dtype] = isinstance(value, numpy.ndarray)
            elif bounds is not None and type(value) is int and bounds[0] <= value <= bounds[1]:
                value = scalar(value)
            else:   # made the exact NumPy scalar type here, so argument_error could not object
                value = _scalar(c_type_, value, f"{self.filename}: {kernel}: parameter {name}")
            result[i] = value
        return result

    @functools.lru_cache(maxsize=None)
    def _c_params(self, kernel: str, dtype_name: str, index: str):
        """((name, C type, pointer, NumPy scalar type, its (min, max) for an integer type), ...) of each parameter of
        one instantiation (pointer: "reads" for a const pointer, "writes" for another, "" for a scalar; the scalar
        type and bounds None for a pointer or a C type no NumPy scalar has), and the set of their names: resolved
        once, not on every launch."""
        params = []
        for p in self.signatures[kernel]:
            c_type_ = resolve_type(p.type, dtype_name, index)
            pointer = ("reads" if c_type_.startswith("const ") else "writes") if c_type_.endswith("*") else ""
            scalar, bounds = (None, None) if pointer or c_type_ not in _SCALAR_DTYPES else _scalar_type(c_type_)
            params.append((p.name, c_type_, pointer, scalar, bounds))
        return tuple(params), frozenset(p.name for p in self.signatures[kernel])

    def launch(self, device, kernel: str, constants=(), *, dtype, index: str, grid, block, shared_mem: int = 0,
               window: ConvSpec | None = None, **args) -> None:
        """Launch kernel<dtype, index, *constants> with named arguments (see `arguments`)."""
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        for size, limit, axis in zip(grid, MAX_GRID, "xyz"):
            if size > limit:
                raise ValueError(f"{self.filename}: {kernel} needs a grid of {size} blocks along {axis}, more than "
                                 f"CUDA's {limit}; the problem is too large for this kernel")
        device.launch(self.filename, self.name(kernel, dtype, index, *constants), grid,
                      tuple(block) if isinstance(block, (tuple, list)) else (block,),
                      self.arguments(kernel, dtype, index, window, **args), shared_mem=shared_mem)
