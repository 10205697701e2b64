"""sigpy's three convolution functions (sigpy.conv) rebuilt on cupyconv, with their adjoints checked.

sigpy (https://github.com/mikgroup/sigpy) defines, for 1-, 2- and 3-D signals:

    convolve(data, filt, mode='full', strides=None, multi_channel=False)
    convolve_data_adjoint(output, filt, data_shape, mode='full', strides=None, multi_channel=False)
    convolve_filter_adjoint(output, data, filt_shape, mode='full', strides=None, multi_channel=False)

Semantics reproduced here (read from sigpy's conv.py and its tests):

- True convolution, not correlation: the filter is flipped along every spatial axis.  cupyconv (like torch)
  computes cross-correlation, so the forward passes the flipped filter.
- Shapes, with D = filt.ndim (single channel) or filt.ndim - 2 (multi_channel=True):
      single channel: data (..., m_1..m_D), filt (n_1..n_D)              -> output (..., p_1..p_D)
      multi-channel:  data (..., c_i, m_1..m_D), filt (c_o, c_i, n_1..n_D) -> output (..., c_o, p_1..p_D)
  Every leading axis ("...") is a batch axis: they are flattened into cupyconv's N and restored after.
- 'full': output p_d = ceil((m_d + n_d - 1) / s_d) -- padding n_d - 1 on both sides; 'valid': p_d =
  ceil((m_d - n_d + 1) / s_d) -- no padding.  Strides subsample the full or valid result from its first sample
  (result[::s_d]), which is exactly a strided convolution with that padding.
- The adjoints are the adjoints of `convolve` as a linear map of the data (filter fixed) and of the filter (data
  fixed): <convolve(x, f), y> = <x, convolve_data_adjoint(y, f, x.shape)> = <f, convolve_filter_adjoint(y, x,
  f.shape)>, complex inner products included.  Here the data adjoint is cupyconv's transposed convolution (the
  gradient of a strided, padded convolution with respect to its input, with output_padding choosing the data
  size among those that share the output size) and the filter adjoint is the weight gradient
  (`conv_nd_backward(needs=("weight",))`), flipped back.
- Complex inputs: cupyconv computes in real dtypes only, so a complex product is split, as sigpy's GPU path does,
  into the four real convolutions  re = f(a_r, b_r) - f(a_i, b_i),  im = f(a_i, b_r) + f(a_r, b_i); the adjoints
  conjugate the fixed operand first (the filter for the data adjoint, the data for the filter adjoint).  Where
  only one operand is complex the two terms with the other's zero imaginary part are skipped.

Where it differs from sigpy: 'valid' mode needs the data at least as large as the filter in every axis (sigpy's
NumPy forward fails, and its GPU path is undefined, when the filter is larger); D is 1, 2 or 3 (cupyconv's
N-d ops; sigpy's NumPy path takes any D, its GPU path the same three); the result's dtype is the promotion of
both operands (sigpy casts to the first operand's dtype).  sigpy's names are the functions' names; the
`convolve_adjoint_data` and `convolve_adjoint_filter` spellings are aliases.

The checks: known answers worked by hand, the forward against a float64 reference (scipy.signal.convolve where
SciPy is installed, else a direct loop over the filter taps), and the dot-product test of both adjoints, over
1-, 2- and 3-D, single and multi-channel, with batch axes, 'full' and 'valid', with and without strides, in
float32, float64, complex64 and complex128, on CuPy arrays with --device gpu (the default where CuPy sees a CUDA
device), on NumPy arrays with --device cpu (`cupyconv` returns the kind it was given, so each function picks its
array module from its input).

    python examples/sigpy_convolve.py                 # more and larger problems
    python examples/sigpy_convolve.py --small         # what CI runs (a few seconds on the CPU)
    python examples/sigpy_convolve.py --device cpu    # NumPy arrays even where there is a GPU
"""
import itertools
import math
import sys
import time

import numpy

import _cli
import cupyconv

__all__ = ["convolve", "convolve_data_adjoint", "convolve_filter_adjoint",
           "convolve_adjoint_data", "convolve_adjoint_filter"]


# ---------------------------------------------------------------------------------------------------------
# The three functions


def _array_module(a):
    """numpy for NumPy arrays, cupy for CuPy arrays (cupyconv returns the kind it is given)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return numpy


def _geometry(data_shape, filt_shape, mode, strides, multi_channel):
    """Sizes of one problem: D, the batch shape, c_i, c_o, data m, filter n, strides s, output p, padding."""
    data_shape, filt_shape = tuple(data_shape), tuple(filt_shape)
    channel_axes = 2 if multi_channel else 0
    dims = len(filt_shape) - channel_axes
    if dims not in (1, 2, 3):
        raise ValueError(f"convolve: {dims} spatial dimensions (filter shape {filt_shape}, multi_channel="
                         f"{multi_channel}); cupyconv's N-d ops take 1, 2 or 3")
    lead = dims + (1 if multi_channel else 0)
    if len(data_shape) < lead:
        raise ValueError(f"convolve: data shape {data_shape} has fewer than the {lead} axes the filter shape "
                         f"{filt_shape} needs")
    m, n = data_shape[-dims:], filt_shape[-dims:]
    batch = data_shape[:len(data_shape) - lead]
    if multi_channel:
        c_o, c_i = filt_shape[0], filt_shape[1]
        if data_shape[-dims - 1] != c_i:
            raise ValueError(f"convolve: the data has {data_shape[-dims - 1]} channels (shape {data_shape}), the "
                             f"filter takes {c_i} (shape {filt_shape})")
    else:
        c_o = c_i = 1
    s = (1,) * dims if strides is None else tuple(int(v) for v in strides)
    if len(s) != dims or any(v < 1 for v in s):
        raise ValueError(f"convolve: strides {strides} must be {dims} positive integers")
    if mode == "full":
        pad = tuple(nd - 1 for nd in n)
        p = tuple(-(-(md + nd - 1) // sd) for md, nd, sd in zip(m, n, s))
    elif mode == "valid":
        if any(md < nd for md, nd in zip(m, n)):
            raise ValueError(f"convolve: 'valid' needs the data at least as large as the filter in every axis, "
                             f"got data {m} and filter {n}")
        pad = (0,) * dims
        p = tuple(-(-(md - nd + 1) // sd) for md, nd, sd in zip(m, n, s))
    else:
        raise ValueError(f"convolve: mode must be 'full' or 'valid', got {mode!r}")
    return dict(dims=dims, batch=batch, images=math.prod(batch), c_i=c_i, c_o=c_o, m=m, n=n, s=s, p=p, pad=pad)


def _flip(xp, a, dims):
    """a reversed along its last `dims` axes, as a new C-contiguous array (a copy: ascontiguousarray keeps the
    negative strides of a reversed view whose axes have one element)."""
    return a[(Ellipsis,) + (slice(None, None, -1),) * dims].copy()


def _real_dtype(*arrays):
    """The real dtype both operands are computed in, and whether the result is complex."""
    dtype = numpy.result_type(*(a.dtype for a in arrays))
    if dtype.kind == "c":
        return numpy.dtype(dtype.char.lower()), True       # complex64 -> float32, complex128 -> float64
    if dtype.kind != "f":
        raise TypeError(f"convolve: floating or complex arrays, got {', '.join(str(a.dtype) for a in arrays)}")
    return dtype, False


def _split_complex(xp, real_op, a, b, real_dtype):
    """real_op (bilinear in a and b, real arrays) on complex a and/or b: the four real products, as sigpy does
    (two where one operand is real)."""
    def parts(v):
        if v.dtype.kind == "c":
            return xp.ascontiguousarray(v.real, dtype=real_dtype), xp.ascontiguousarray(v.imag, dtype=real_dtype)
        return xp.ascontiguousarray(v, dtype=real_dtype), None

    (ar, ai), (br, bi) = parts(a), parts(b)
    re = real_op(ar, br)
    im = None
    if ai is not None and bi is not None:
        re = re - real_op(ai, bi)
    if ai is not None:
        im = real_op(ai, br)
    if bi is not None:
        im = real_op(ar, bi) if im is None else im + real_op(ar, bi)
    return re + 1j * im


def convolve(data, filt, mode="full", strides=None, multi_channel=False):
    """sigpy.conv.convolve: the N-d (1-3) convolution of data with filt (the filter flipped), 'full' or
    'valid', strided, optionally multi-channel, over any leading batch axes."""
    xp = _array_module(data)
    g = _geometry(data.shape, filt.shape, mode, strides, multi_channel)
    real_dtype, is_complex = _real_dtype(data, filt)

    def real_op(x, f):
        x = x.reshape((g["images"], g["c_i"]) + g["m"])
        w = _flip(xp, f.reshape((g["c_o"], g["c_i"]) + g["n"]), g["dims"])
        return cupyconv.conv_nd(x, w, stride=g["s"], padding=g["pad"])

    if is_complex:
        out = _split_complex(xp, real_op, data, filt, real_dtype)
    else:
        out = real_op(xp.ascontiguousarray(data, dtype=real_dtype), xp.ascontiguousarray(filt, dtype=real_dtype))
    channels = (g["c_o"],) if multi_channel else ()
    return out.reshape(g["batch"] + channels + g["p"])


def convolve_data_adjoint(output, filt, data_shape, mode="full", strides=None, multi_channel=False):
    """sigpy.conv.convolve_data_adjoint: the adjoint of convolve(., filt) applied to output; data_shape shaped."""
    xp = _array_module(output)
    g = _geometry(data_shape, filt.shape, mode, strides, multi_channel)
    real_dtype, is_complex = _real_dtype(output, filt)
    # The transposed convolution's size is (p - 1) s - 2 pad + n + output_padding: output_padding picks m.
    extra = tuple(md + 2 * pd - nd - (pp - 1) * sd
                  for md, nd, sd, pp, pd in zip(g["m"], g["n"], g["s"], g["p"], g["pad"]))

    def real_op(y, f):
        y = y.reshape((g["images"], g["c_o"]) + g["p"])
        w = _flip(xp, f.reshape((g["c_o"], g["c_i"]) + g["n"]), g["dims"])  # the forward's weight
        return cupyconv.conv_transpose_nd(y, w, stride=g["s"], padding=g["pad"], output_padding=extra)

    if is_complex:
        out = _split_complex(xp, real_op, output, xp.conj(filt), real_dtype)
    else:
        out = real_op(xp.ascontiguousarray(output, dtype=real_dtype), xp.ascontiguousarray(filt, dtype=real_dtype))
    return out.reshape(tuple(data_shape))


def convolve_filter_adjoint(output, data, filt_shape, mode="full", strides=None, multi_channel=False):
    """sigpy.conv.convolve_filter_adjoint: the adjoint of convolve(data, .) applied to output; filt_shape shaped."""
    xp = _array_module(data)
    g = _geometry(data.shape, filt_shape, mode, strides, multi_channel)
    real_dtype, is_complex = _real_dtype(output, data)
    weight_shape = (g["c_o"], g["c_i"]) + g["n"]

    def real_op(y, x):
        y = y.reshape((g["images"], g["c_o"]) + g["p"])
        x = x.reshape((g["images"], g["c_i"]) + g["m"])
        # needs=("weight",) reads only the weight's shape and dtype, never its values.
        weight = xp.zeros(weight_shape, dtype=real_dtype)
        _, grad_w, _ = cupyconv.conv_nd_backward(y, x, weight, stride=g["s"], padding=g["pad"], needs=("weight",))
        return _flip(xp, grad_w, g["dims"])     # the gradient of the flipped filter, flipped back

    if is_complex:
        out = _split_complex(xp, real_op, output, xp.conj(data), real_dtype)
    else:
        out = real_op(xp.ascontiguousarray(output, dtype=real_dtype), xp.ascontiguousarray(data, dtype=real_dtype))
    return out.reshape(tuple(filt_shape))


convolve_adjoint_data = convolve_data_adjoint
convolve_adjoint_filter = convolve_filter_adjoint


# ---------------------------------------------------------------------------------------------------------
# The float64 reference of the forward


def _scipy_convolve():
    try:
        from scipy.signal import convolve as scipy_convolve
        return scipy_convolve
    except ImportError:
        return None


def _full_single(a, f, scipy_convolve):
    """Full convolution over the last f.ndim axes of a (leading axes: a batch), float64 or complex128."""
    dims = f.ndim
    if scipy_convolve is not None:
        lead = a.ndim - dims
        return scipy_convolve(a, f.reshape((1,) * lead + f.shape), mode="full", method="direct")
    m = a.shape[-dims:]
    out = numpy.zeros(a.shape[:-dims] + tuple(md + nd - 1 for md, nd in zip(m, f.shape)),
                      numpy.result_type(a, f))
    for tap in itertools.product(*(range(nd) for nd in f.shape)):
        window = (Ellipsis,) + tuple(slice(t, t + md) for t, md in zip(tap, m))
        out[window] += f[tap] * a
    return out


def reference_convolve(data, filt, mode="full", strides=None, multi_channel=False):
    """sigpy's definition written out directly on the host, in float64 / complex128: for every output channel,
    the sum over input channels of the full convolution, cut to 'valid', subsampled by the strides."""
    data = numpy.asarray(data).astype(numpy.complex128 if numpy.iscomplexobj(data) else numpy.float64)
    filt = numpy.asarray(filt).astype(numpy.complex128 if numpy.iscomplexobj(filt) else numpy.float64)
    g = _geometry(data.shape, filt.shape, mode, strides, multi_channel)
    dims, scipy_convolve = g["dims"], _scipy_convolve()
    x = data.reshape((g["images"], g["c_i"]) + g["m"])
    f = filt.reshape((g["c_o"], g["c_i"]) + g["n"])
    cut = tuple(slice(nd - 1, md) if mode == "valid" else slice(None) for md, nd in zip(g["m"], g["n"]))
    step = tuple(slice(None, None, sd) for sd in g["s"])
    out = numpy.stack([sum(_full_single(x[:, i], f[o, i], scipy_convolve) for i in range(g["c_i"]))
                       for o in range(g["c_o"])], axis=1)
    out = out[(Ellipsis,) + cut][(Ellipsis,) + step]
    assert out.shape[-dims:] == g["p"], (out.shape, g["p"])
    channels = (g["c_o"],) if multi_channel else ()
    return out.reshape(g["batch"] + channels + g["p"])


# ---------------------------------------------------------------------------------------------------------
# Checks


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, numpy.ndarray) else numpy.asarray(a)


def _rel(a, b):
    a, b = _host(a).astype(numpy.complex128), _host(b).astype(numpy.complex128)
    return float(numpy.abs(a - b).max(initial=0.0) / max(float(numpy.abs(b).max(initial=0.0)), 1e-30))


TOLERANCE = {"float32": 2e-5, "complex64": 2e-5, "float64": 1e-12, "complex128": 1e-12}


class Report:
    def __init__(self):
        self.failures, self.worst, self.count = [], {}, 0

    def check(self, label, error, tolerance, group):
        self.count += 1
        self.worst[group] = max(self.worst.get(group, 0.0), error)
        if not error <= tolerance:
            self.failures.append(f"{label}: error {error:.2e} > {tolerance:.0e}")


def known_answers(xp, report):
    """Small problems whose answers are worked out by hand (1-D, filter [1, 10], data [1, 2, 3])."""
    x = xp.asarray([1.0, 2.0, 3.0])
    f = xp.asarray([1.0, 10.0])
    y = xp.asarray([1.0, 2.0, 3.0, 4.0])
    cases = [
        # A convolution: y_j = sum_t f_t x_(j-t); a correlation would give [10, 21, 32, 3].
        ("full", convolve(x, f), [1, 12, 23, 30]),
        ("valid", convolve(x, f, mode="valid"), [12, 23]),
        ("full, stride 2", convolve(x, f, strides=(2,)), [1, 23]),
        ("valid, stride 2 (one output)", convolve(x, f, mode="valid", strides=[2]), [12]),
        # A^H y for the full map: x_i = y_i + 10 y_(i+1).
        ("data adjoint, full", convolve_data_adjoint(y, f, (3,)), [21, 32, 43]),
        # The strided full output [1, 23] comes from positions 0 and 2 of the full result.
        ("data adjoint, full, stride 2", convolve_data_adjoint(xp.asarray([1.0, 2.0]), f, (3,), strides=(2,)),
         [1, 20, 2]),
        # f_0 = sum_j y_j x_j, f_1 = sum_j y_(j+1) x_j.
        ("filter adjoint, full", convolve_filter_adjoint(y, x, (2,)), [14, 20]),
        ("filter adjoint, valid", convolve_filter_adjoint(xp.asarray([1.0, 2.0]), x, (2,), mode="valid"),
         [2 + 6, 1 + 4]),
        # Two output channels of one input channel, a batch of one: each output channel is the full result.
        ("multi-channel full", convolve(x.reshape(1, 1, 3), xp.stack([f, 2 * f]).reshape(2, 1, 2),
                                        multi_channel=True), [[[1, 12, 23, 30], [2, 24, 46, 60]]]),
        # Complex: (1 + i) * (2 - i) = 3 + i in every product.
        ("complex", convolve(xp.asarray([1 + 1j, 0]), xp.asarray([2 - 1j])), [3 + 1j, 0]),
    ]
    for label, got, want in cases:
        want = numpy.asarray(want)
        error = float("inf") if _host(got).shape != want.shape else _rel(got, want)
        report.check(f"known answer, {label}", error, 1e-12, "known answers")


def problems(small):
    """(label, data shape, filter shape, mode, strides, multi_channel): 1-, 2- and 3-D, single channel with and
    without batch axes, multi-channel with one and two batch axes, 'full' and 'valid', with and without strides."""
    if small:
        sizes = {1: ((17,), (4,)), 2: ((9, 8), (3, 2)), 3: ((6, 5, 4), (3, 2, 2))}
        batches = {False: (2,), True: (2,)}
        channels = (3, 2)   # c_i, c_o
    else:
        sizes = {1: ((64,), (7,)), 2: ((20, 17), (5, 3)), 3: ((10, 9, 8), (3, 4, 2))}
        batches = {False: (3, 2), True: (2, 2)}
        channels = (4, 3)
    out = []
    for dims, (m, n) in sizes.items():
        for multi_channel in (False, True):
            c_i, c_o = channels
            data = batches[multi_channel] + ((c_i,) if multi_channel else ()) + m
            filt = ((c_o, c_i) if multi_channel else ()) + n
            for mode in ("full", "valid"):
                for strides in (None, tuple(range(2, 2 + dims))):   # (2,), (2, 3), (2, 3, 4)
                    label = (f"{dims}-D {'multi-channel' if multi_channel else 'single channel'} data {data} "
                             f"filt {filt} {mode} strides {strides}")
                    out.append((label, data, filt, mode, strides, multi_channel))
        # No batch axes at all (a bare signal, or channels only).
        out.append((f"{dims}-D bare signal {m} filt {n} full", m, n, "full", None, False))
    return out


def _random(xp, rng, shape, dtype):
    a = rng.standard_normal(shape)
    if numpy.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return xp.asarray(a.astype(dtype))


def _inner(a, b):
    """<a, b> = sum conj(a) b, in complex128 on the host."""
    return complex(numpy.vdot(_host(a).astype(numpy.complex128).ravel(), _host(b).astype(numpy.complex128).ravel()))


def check_problem(xp, rng, report, where, problem, dtype):
    label, data_shape, filt_shape, mode, strides, multi_channel = problem
    name = f"{where} {numpy.dtype(dtype).name} {label}"
    x = _random(xp, rng, data_shape, dtype)
    f = _random(xp, rng, filt_shape, dtype)
    y = convolve(x, f, mode=mode, strides=strides, multi_channel=multi_channel)
    want = reference_convolve(_host(x), _host(f), mode=mode, strides=strides, multi_channel=multi_channel)
    tolerance = TOLERANCE[numpy.dtype(dtype).name]
    same_kind = type(y) is type(x) and y.dtype == numpy.dtype(dtype)
    report.check(f"{name}: forward vs reference" + ("" if same_kind else f" (got {type(y)} {y.dtype})"),
                 _rel(y, want) if same_kind and y.shape == want.shape else float("inf"), tolerance,
                 f"forward vs reference, {numpy.dtype(dtype).name}")

    # Dot-product tests: <A x, v> = <x, A^H v> for the data map and <A_x f, v> = <f, A_x^H v> for the filter map.
    v = _random(xp, rng, y.shape, dtype)
    xa = convolve_data_adjoint(v, f, data_shape, mode=mode, strides=strides, multi_channel=multi_channel)
    fa = convolve_filter_adjoint(v, x, filt_shape, mode=mode, strides=strides, multi_channel=multi_channel)
    lhs = _inner(y, v)
    for what, got, shape, operand in (("data", xa, data_shape, x), ("filter", fa, filt_shape, f)):
        if tuple(got.shape) != tuple(shape) or type(got) is not type(x):
            report.check(f"{name}: {what} adjoint shape {got.shape} / kind {type(got)}", float("inf"), 0, "shapes")
            continue
        rhs = _inner(operand, got)
        error = abs(lhs - rhs) / max(abs(lhs), abs(rhs), 1e-30)
        report.check(f"{name}: <A x, y> = <x, A^H y> for the {what} adjoint", error, tolerance * 10,
                     f"dot-product test, {numpy.dtype(dtype).name}")


def check_errors(report):
    """The argument errors sigpy raises, raised here too."""
    x, f = numpy.zeros((2, 5)), numpy.zeros((3,))
    bad = [
        ("mode 'same'", lambda: convolve(x, f, mode="same")),
        ("strides of the wrong length", lambda: convolve(x, f, strides=(2, 2))),
        ("channel mismatch", lambda: convolve(numpy.zeros((1, 2, 5)), numpy.zeros((3, 4, 2)), multi_channel=True)),
        ("4 spatial dims", lambda: convolve(numpy.zeros((3,) * 4), numpy.zeros((2,) * 4))),
        ("valid with a larger filter", lambda: convolve(numpy.zeros(3), numpy.zeros(4), mode="valid")),
    ]
    for label, call in bad:
        try:
            call()
        except ValueError:
            report.check(f"error: {label}", 0.0, 0.0, "argument errors")
        else:
            report.check(f"error: {label} was accepted", float("inf"), 0.0, "argument errors")


def main(argv=None):
    args = _cli.parser(__doc__, small="fewer, smaller problems").parse_args(argv)
    t0 = time.perf_counter()
    report = Report()
    rng = numpy.random.default_rng(0)
    xp = _cli.array_module(_cli.device(args))
    print(f"reference: {'scipy.signal.convolve' if _scipy_convolve() else 'a direct float64 loop over the taps'}; "
          f"arrays: {xp.__name__}")

    check_errors(report)
    known_answers(xp, report)
    for problem in problems(args.small):
        for dtype in (numpy.float32, numpy.float64, numpy.complex64, numpy.complex128):
            check_problem(xp, rng, report, xp.__name__, problem, dtype)

    for group, worst in report.worst.items():
        print(f"  {group:<40} max error {worst:.2e}")
    print(f"{report.count} checks ({len(problems(args.small))} problems x 4 dtypes on {xp.__name__} arrays, plus known "
          f"answers and argument errors) in {time.perf_counter() - t0:.1f} s")
    for failure in report.failures:
        print("MISMATCH:", failure, file=sys.stderr)
    if report.failures:
        sys.exit(f"{len(report.failures)} of {report.count} checks failed")
    print("all checks passed")


if __name__ == "__main__":
    main()
