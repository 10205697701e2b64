"""cupyconv._kernels: kernel signatures read from the CUDA source, named arguments, the shared argument check, the
constants Python and CUDA share, and grid sizes."""
import re

import numpy
import pytest
from optional_deps import BFLOAT16, Lazy, bfloat16, resolve

from cupyconv import _device, _kernels
from cupyconv._kernels import KernelFile, Param, argument_error, parse_signatures, resolve_type
from cupyconv._spec import ConvSpec
from emulator import EmulatedDevice
from emulator._device import _c_name

SOURCE = """
// a comment mentioning __global__ void not_a_kernel(int x) {
template <typename T, typename I, int K>
__global__ void __launch_bounds__(256) scale(const T* __restrict__ x, acc_t<T>* __restrict__ partial,
                                             T* out, I n, int kernel_h, /* inline comment */ int pad_top,
                                             long long big, float factor) {
}
template <typename T>
__device__ __forceinline__ void helper(T* p) {}
template <typename T, typename I> __global__ void empty_args() {}
"""


def test_parse_signatures_reads_every_global_template_and_nothing_else():
    signatures = parse_signatures(SOURCE)
    assert set(signatures) == {"scale", "empty_args"}
    assert signatures["scale"] == (
        Param("x", "const T*"), Param("partial", "acc_t<T>*"), Param("out", "T*"), Param("n", "I"),
        Param("kernel_h", "int"), Param("pad_top", "int"), Param("big", "long long"), Param("factor", "float"))
    assert signatures["empty_args"] == ()


@pytest.mark.parametrize("declared, dtype, index, resolved", [
    ("const T*", numpy.float16, "int", "const __half*"),
    ("acc_t<T>*", BFLOAT16, "int", "float*"),
    ("acc_t<T>*", numpy.float64, "int", "double*"),
    ("I", numpy.float32, "long long", "long long"),
    ("int", numpy.float32, "long long", "int"),
])
def test_resolve_type(declared, dtype, index, resolved):
    assert resolve_type(declared, resolve(dtype), index) == resolved


class FakeKernelFile(KernelFile):
    """A KernelFile over SOURCE instead of raw_kernels/."""

    @property
    def signatures(self):
        return parse_signatures(SOURCE)


def scale_args(**replace):
    args = dict(x=numpy.zeros(3, numpy.float32), partial=numpy.zeros(3, numpy.float32),
                out=numpy.zeros(3, numpy.float32), n=3, kernel_h=3, pad_top=-1, big=2**40, factor=0.5)
    args.update(replace)
    return args


def test_arguments_come_out_in_c_order_with_exact_scalar_types():
    args = FakeKernelFile("fake.cu").arguments("scale", numpy.float32, "int", **scale_args())
    assert [type(a) for a in args[3:]] == [numpy.int32, numpy.int32, numpy.int32, numpy.int64, numpy.float32]
    assert args[3:] == [3, 3, -1, 2**40, 0.5]
    args = FakeKernelFile("fake.cu").arguments("scale", numpy.float32, "long long", **scale_args())
    assert type(args[3]) is numpy.int64  # I = long long


def test_window_fills_only_the_geometry_the_kernel_declares():
    spec = ConvSpec.geometry("t", (1,), 1, 1, 1, (5, 5), 3, 1, ((2, 0), (1, 1)), 1)
    args = scale_args()
    del args["kernel_h"], args["pad_top"]
    bound = FakeKernelFile("fake.cu").arguments("scale", numpy.float32, "int", window=spec, **args)
    assert bound[4:6] == [3, 2]  # kernel_h, pad_top (the top side: the bottom is implied by the sizes)


@pytest.mark.parametrize("replace, error, message", [
    (dict(kernel_h=None), TypeError, r"no value for parameter kernel_h"),
    (dict(typo=1), TypeError, r"has no parameter typo"),
    (dict(n=2**31), OverflowError, r"2147483648 does not fit the `int` parameter"),
    (dict(big=2**63), OverflowError, r"does not fit the `long long`"),
    (dict(n=1.5), TypeError, r"`int` needs an integer, got 1.5"),
    (dict(out=numpy.zeros(3, numpy.float64)), TypeError, r"parameter out is `float\*`: the element types differ"),
    (dict(partial=numpy.zeros(3, numpy.float16)), TypeError, r"parameter partial is `float\*`"),
    (dict(x=numpy.float32(1)), TypeError, r"parameter x is `const float\*`: pass an array"),
    (dict(out=numpy.broadcast_to(numpy.float32(0), (3,))), TypeError, r"read-only"),
])
def test_bad_arguments_are_refused_before_launch(replace, error, message):
    args = scale_args(**replace)
    if replace.get("kernel_h", 0) is None:
        del args["kernel_h"]
    with pytest.raises(error, match=message):
        FakeKernelFile("fake.cu").arguments("scale", numpy.float32, "int", **args)


def test_arguments_that_passed_before_do_not_let_a_bad_one_through():
    """`arguments` remembers the (C type, array type, dtype) of arrays that passed, to skip their check on the next
    launch: an array of another dtype, a read-only view where the kernel writes, or a scalar for a pointer is still
    refused after good arrays of the same parameters went through."""
    kernels = FakeKernelFile("fake.cu")
    for _ in range(2):
        kernels.arguments("scale", numpy.float32, "int", **scale_args())
    read_only = numpy.zeros(3, numpy.float32)
    read_only.flags.writeable = False
    kernels.arguments("scale", numpy.float32, "int", **scale_args(x=read_only))   # const T*: may be read-only
    for bad, message in ((dict(out=read_only), r"parameter out is `float\*`: the kernel may write through it"),
                         (dict(out=numpy.zeros(3, numpy.float64)), r"parameter out is `float\*`: the element types"),
                         (dict(x=numpy.float32(1)), r"parameter x is `const float\*`: pass an array"),
                         (dict(n=numpy.int64(2**31)), r"2147483648 does not fit the `int` parameter")):
        with pytest.raises((TypeError, OverflowError), match=message):
            kernels.arguments("scale", numpy.float32, "int", **scale_args(**bad))


@pytest.mark.parametrize("c_type, value, expected", [
    ("const __nv_bfloat16*", Lazy(lambda: numpy.zeros(2, bfloat16()), "bfloat16-zeros"), None),
    ("const __nv_bfloat16*", numpy.zeros(2, numpy.uint16), None),  # raw bits: NumPy has no bfloat16
    ("const __half*", numpy.zeros(2, numpy.uint16), "the element types differ"),
    ("int", numpy.int32(1), None),
    ("int", numpy.int64(1), "pass numpy.int32"),
    ("int", 1, "scalars must be NumPy scalars"),
    ("unsigned int", numpy.uint32(1), None),
    ("double", numpy.float32(1), "pass numpy.float64"),
    ("size_t", numpy.uint64(1), "a type that cannot be passed"),
])
def test_argument_error(c_type, value, expected):
    error = argument_error(c_type, resolve(value))
    assert error == expected if expected is None else error.startswith(expected), error


@pytest.mark.parametrize("filename", sorted(_device.kernel_files()))
def test_parsed_signatures_match_what_the_compiler_saw(filename):
    """Every shipped instantiation: the parameter types read from the source, resolved for its <T, I>, equal
    the signature the emulator reads from the compiled binary (so launches bind what the compiler compiled)."""
    kernels = _device.kernel_files()[filename]
    device = EmulatedDevice()
    names = [n for f, n in _device.all_instantiations() if f == filename]
    library = device._library_for(filename)
    dtypes = {"__half": numpy.float16, "__nv_bfloat16": bfloat16(), "float": numpy.float32,
              "double": numpy.float64}
    for name in names:
        kernel, t, index = re.fullmatch(r"(\w+)<([^,]+), ([^,>]+)[^>]*>", name).groups()
        parsed = [resolve_type(p.type, dtypes[t], index) for p in kernels.signatures[kernel]]
        compiled = [_c_name(code) for code in library.kernel(name).codes]
        assert parsed == compiled, name


@pytest.mark.parametrize("filename", sorted(_device.kernel_files()))
def test_shared_constants_are_defined_by_python_only(filename):
    """The -D constants a kernel file requires are exactly its KernelFile's, and the file defines none itself."""
    text = _device.kernel_source(filename)
    required = set(re.findall(r"!defined\((\w+)\)", text))
    assert required == set(_device.kernel_files()[filename].defines)
    for name in required:
        assert not re.search(rf"#\s*define\s+{name}\b", text), f"{filename} defines {name} itself"
        assert f"-D{name}=" in " ".join(_device.compile_options(filename))


def test_grid_helpers():
    assert _kernels.capped_grid(0) == 1 and _kernels.capped_grid(10) == 10
    assert _kernels.capped_grid(10**9) == _kernels.GRID_CAP
    assert _kernels.elementwise_launch(1000) == ((4,), (256,))
    assert _kernels.elementwise_launch(10**12) == ((_kernels.GRID_CAP,), (256,))


def test_launch_refuses_a_grid_beyond_cuda_limits():
    class NoLaunch(_device.Device):
        def launch(self, *args, **kwargs):
            raise AssertionError("must not be reached")

    kernels = FakeKernelFile("fake.cu")
    with pytest.raises(ValueError, match=r"grid of 65536 blocks along y, more than CUDA's 65535"):
        kernels.launch(NoLaunch(), "scale", dtype=numpy.float32, index="int", grid=(1, 65536), block=32,
                       **scale_args())


FAST_DIVMOD_KERNEL = """#include "common.cuh"
__global__ void fast_divmod(const int* n, const int* d, int* q, int* r, int count) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) q[i] = FastDivmod(d[i]).divmod(n[i], r[i]);
}
"""


def test_fast_divmod_is_exact_below_2_to_the_31(tmp_path):
    """common.cuh's FastDivmod against Python's // and %: every divisor the kernels use (1 to 64: kernel sizes,
    strides, widths), powers of two and their neighbours up to 2^31 - 1, each with numerators at 0, near
    multiples of the divisor and near 2^31 - 1, where the multiply-high sum is closest to overflowing."""
    (tmp_path / "common.cuh").write_text((_device.kernel_dir() / "common.cuh").read_text())
    (tmp_path / "fastdiv.cu").write_text(FAST_DIVMOD_KERNEL)
    rng = numpy.random.default_rng(0)
    divisors = list(range(1, 65)) + [p + o for p in (2**k for k in range(6, 31)) for o in (-1, 0, 1)] + [2**31 - 1]
    n, d = [], []
    for divisor in divisors:
        near = [0, 1, divisor - 1, divisor, divisor + 1, 2**31 - 1, 2**31 - 2, (2**31 - 1) // divisor * divisor,
                (2**31 - 1) // divisor * divisor - 1]
        for value in near + list(rng.integers(0, 2**31, 24)):
            if 0 <= value < 2**31:
                n.append(value)
                d.append(divisor)
    n, d = numpy.array(n, numpy.int32), numpy.array(d, numpy.int32)
    device = EmulatedDevice(kernel_dir=tmp_path, instantiations=[("fastdiv.cu", "fast_divmod")])
    q, r = device.empty(n.shape, numpy.int32), device.empty(n.shape, numpy.int32)
    device.launch("fastdiv.cu", "fast_divmod", 1, 256, [n, d, q, r, numpy.int32(n.size)])
    numpy.testing.assert_array_equal(q, n.astype(numpy.int64) // d)
    numpy.testing.assert_array_equal(r, n.astype(numpy.int64) % d)
