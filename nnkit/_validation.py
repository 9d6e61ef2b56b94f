"""Validation at the public boundary: one place for the checks and their messages.

Every public entry point validates its inputs here once, then hands plain C-contiguous
arrays to the kernels (which check nothing). Messages name the argument, what was
expected and what arrived, in the style of scikit-learn's ``check_array``.

One error type per failure, as NumPy and torch: a wrong type, device or dtype is a
``TypeError``; a wrong shape, value, layout (not C-contiguous) or a read-only ``out`` is a
``ValueError``. ``check_same_device`` and ``check_out`` hold the device and ``out=`` rules
of every kernel family.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._backend import backend, describe_device, is_gpu_array

FLOATS = (np.float32, np.float64)
COMPLEX = (np.complex64, np.complex128)
INTEGERS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)

__all__ = [
    "FLOATS",
    "COMPLEX",
    "INTEGERS",
    "check_array",
    "check_same_shape",
    "check_same_device",
    "check_same_dtype",
    "check_out",
    "check_grad",
    "check_cache",
    "check_scalar",
    "check_int_tuple",
    "MAX_GEOMETRY",
    "check_choice",
    "axis_or_dim",
    "check_bool",
    "check_real",
    "check_input_dtype",
    "check_native_byte_order",
    "describe_dtype",
    "dtype_names",
]


def dtype_names(dtypes) -> str:
    """'float32 or float64' for a tuple of dtypes."""
    names = [np.dtype(d).name for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def describe_dtype(dtype) -> str:
    """A dtype for a message: 'float64', or '>f8 (float64, big-endian)' when its byte order
    is not this machine's (NumPy prints such a dtype as '>f8', which hides the reason)."""
    dtype = np.dtype(dtype)
    if dtype.isnative:
        return str(dtype)
    order = "big-endian" if dtype.byteorder == ">" else "little-endian"
    return f"{dtype.str} ({dtype.newbyteorder('=').name}, {order})"


def check_native_byte_order(arr, *, name: str):
    """Raise ``TypeError`` when the NumPy array ``arr`` has non-native byte order.

    For arrays written in place (``out=``): unlike inputs, which :func:`check_array`
    converts, such an array cannot be replaced by a converted copy.
    """
    if isinstance(arr, np.ndarray) and not arr.dtype.isnative:
        raise TypeError(
            f"{name} has dtype {describe_dtype(arr.dtype)}, not this machine's byte order; "
            f"it is written in place, so it cannot be converted: pass an array of native "
            f"byte order, e.g. np.empty_like(x)"
        )
    return arr


def check_array(
    x,
    *,
    name: str,
    ndim=None,
    dtype=None,
    min_ndim: int | None = None,
    finite: bool = False,
    contiguous: bool = True,
    allow_device: bool = True,
):
    """Return ``x`` as an array with the required rank and dtype, or raise.

    Parameters
    ----------
    x : array_like
        The argument to check. NumPy and CuPy arrays pass through (made C-contiguous when
        ``contiguous``); other GPU arrays (``__cuda_array_interface__``) pass through
        unchanged when ``allow_device``; anything else goes through ``np.asarray``.
    name : str
        The argument's name, used in the messages.
    ndim : int or tuple of int, optional
        Accepted rank(s).
    dtype : dtype or tuple of dtypes, optional
        Accepted dtypes. ``x`` is never cast silently: a wrong dtype is a ``TypeError``. A
        NumPy array of non-native byte order (``'>f8'`` on a little-endian machine) is
        copied to native byte order first: the same values and type, in the layout the
        kernels read.
    min_ndim : int, optional
        Smallest accepted rank.
    finite : bool
        Reject NaN and infinity (CPU arrays only).
    contiguous : bool
        Return a C-contiguous array (copies non-contiguous views, NumPy's and CuPy's).
    """
    if is_gpu_array(x):
        if not allow_device:
            raise TypeError(
                f"{name} must be a NumPy array here; got a GPU array {type(x).__name__}"
            )
        arr = x
    else:
        if isinstance(x, (str, bytes)) or x is None:
            raise TypeError(f"{name} must be an array, got {type(x).__name__}")
        try:
            arr = np.asarray(x)
        except Exception as exc:  # ragged lists, objects numpy cannot hold
            raise TypeError(f"{name} could not be converted to an array: {exc}") from None
        if arr.dtype == object:
            raise TypeError(f"{name} must hold numbers, got an object array")
        if not arr.dtype.isnative:  # '>f8' on a little-endian machine: same values, native
            arr = arr.astype(arr.dtype.newbyteorder("="))
    if ndim is not None:
        ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in ndims:
            expected = " or ".join(str(n) for n in ndims)
            raise ValueError(
                f"{name} must be {expected}-dimensional, got shape {tuple(arr.shape)} "
                f"({arr.ndim}-dimensional)"
            )
    if min_ndim is not None and arr.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(arr.shape)}"
        )
    if dtype is not None:
        dtypes = (dtype,) if not isinstance(dtype, tuple) else dtype
        if np.dtype(arr.dtype) not in [np.dtype(d) for d in dtypes]:
            raise TypeError(f"{name} must have dtype {dtype_names(dtypes)}, got "
                            f"{describe_dtype(arr.dtype)}")
    if finite and isinstance(arr, np.ndarray) and arr.dtype.kind in "fc":
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} must be finite, but it holds NaN or infinity")
    if contiguous and isinstance(arr, np.ndarray) and not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    elif contiguous and _needs_device_copy(arr):
        arr = arr.copy()  # CuPy's copy: C order, positive strides
    return arr


def _needs_device_copy(arr) -> bool:
    """A CuPy array that is not C-contiguous, or has a negative stride: Numba CUDA refuses
    negative strides even on axes of length 1, where CuPy calls the array contiguous."""
    if not type(arr).__module__.startswith("cupy"):
        return False
    return not arr.flags.c_contiguous or any(s < 0 for s in arr.strides)


def check_same_shape(a, b, *, name_a: str, name_b: str) -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` have the same shape."""
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )


def _where(device: str) -> str:
    return "a GPU array" if device == "cuda" else "a NumPy array"


def check_same_device(array, like, *, name: str, like_name: str = "x"):
    """Return ``array`` if it lives where ``like`` does (both NumPy arrays or both GPU
    arrays), else raise ``TypeError``: "weight must be a GPU array like x, got a NumPy
    array". ``like`` is an array, or a backend name ('cpu' or 'cuda') where only that is
    kept (a cache)."""
    want = like if isinstance(like, str) else backend(like)
    if backend(array) != want:
        raise TypeError(f"{name} must be {_where(want)} like {like_name}, got "
                        f"{describe_device(array)}")
    return array


def check_same_dtype(array, like, *, name: str, like_name: str = "x"):
    """Return ``array`` if it has ``like``'s dtype, else raise ``TypeError`` naming both
    (kernels take one dtype; nothing is cast silently)."""
    if array.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {describe_dtype(array.dtype)} but {like_name} has "
                        f"dtype {describe_dtype(like.dtype)}; they must match (cast one of "
                        f"them)")
    return array


def check_companion(x, like, *, name: str, like_name: str, shape, what: str,
                    dtypes=FLOATS):
    """``x``, an array that goes with ``like`` (an op's second input, say), checked: rank and
    dtypes as ``check_array``, ``like``'s device and dtype, and ``shape`` exactly (``what``
    names the layout in the message: "(batch, heads, T)")."""
    x = check_array(x, name=name, ndim=len(shape), dtype=dtypes)
    check_same_device(x, like, name=name, like_name=like_name)
    if x.dtype != like.dtype:
        raise TypeError(f"{name} must have {like_name}'s dtype ({like.dtype}), got {x.dtype}; "
                        "cast it")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {what} = {tuple(shape)} to match "
                         f"{like_name} of shape {tuple(like.shape)}, got {tuple(x.shape)}")
    return x


def check_out(out, like, *, name: str = "out", like_name: str = "x", shape=None):
    """Return ``out``, a preallocated result the kernels write in place (unchecked), or raise.

    It must be an array on ``like``'s device (``TypeError``), of ``shape`` (default
    ``like``'s; ``ValueError``), of ``like``'s dtype in native byte order (``TypeError``:
    it cannot be replaced by a converted copy), C-contiguous and writeable (``ValueError``).
    """
    want = backend(like)
    if not (isinstance(out, np.ndarray) or is_gpu_array(out)) or backend(out) != want:
        raise TypeError(f"{name} must be {_where(want)} like {like_name}, got "
                        f"{describe_device(out)}")
    shape = tuple(like.shape) if shape is None else tuple(shape)
    if tuple(out.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (that of {like_name}), got "
                         f"{tuple(out.shape)}")
    check_native_byte_order(out, name=name)
    if out.dtype != like.dtype:
        raise TypeError(f"{name} must have dtype {like.dtype} (that of {like_name}), got "
                        f"{describe_dtype(out.dtype)}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (it is written in place)")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{name} is read-only (it is written in place)")
    return out


def check_grad(dy, *, shape, dtype, device, name: str = "dy", dtypes=FLOATS):
    """Return the upstream gradient ``dy`` of a forward's output as a C-contiguous array,
    or raise: it must be an array of one of ``dtypes`` (``TypeError``) on ``device``
    ('cpu' or 'cuda', ``TypeError``), of ``shape`` (``ValueError``) and of ``dtype``
    (``TypeError``), as the backward's cache recorded the output. A backward checks this
    and nothing else: its cache comes from the validated forward."""
    dy = check_array(dy, name=name, dtype=dtypes)
    check_same_device(dy, device, name=name, like_name="the forward's output")
    if tuple(dy.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} like the forward's output, "
                         f"got shape {tuple(dy.shape)}")
    if dy.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)} like the forward's output, "
                        f"got {describe_dtype(dy.dtype)}")
    return dy


def check_cache(cache, cls, *, forward: str):
    """Return ``cache`` if it is the ``cls`` that ``forward`` returns, else ``TypeError``."""
    if not isinstance(cache, cls):
        raise TypeError(f"cache must be the {cls.__name__} returned by {forward}, got "
                        f"{type(cache).__name__}")
    return cache


def check_scalar(
    value,
    *,
    name: str,
    kind=numbers.Real,
    low=None,
    high=None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
):
    """Check a hyper-parameter: its type, finiteness and range; return it unchanged.

    ``kind`` is ``numbers.Real`` or ``numbers.Integral``. Booleans are never numbers here.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kind):
        what = "an integer" if kind is numbers.Integral else "a real number"
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    if kind is numbers.Real:
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite:
            raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (value < low or (value == low and not low_inclusive)):
        op = ">=" if low_inclusive else ">"
        raise ValueError(f"{name} must be {op} {low}, got {value!r}")
    if high is not None and (value > high or (value == high and not high_inclusive)):
        op = "<=" if high_inclusive else "<"
        raise ValueError(f"{name} must be {op} {high}, got {value!r}")
    return value


# Largest kernel_size, stride, padding or dilation accepted: the convolution and pooling
# kernels compute indices such as ``a * stride - padding + i * dilation`` and the products of
# two of these in int64, which stay far below 2^63 when each factor is at most 2^31 - 1 (the
# output sizes and array extents are bounded by memory).
MAX_GEOMETRY = 2**31 - 1


def check_int_tuple(value, n: int, *, name: str, low: int) -> tuple:
    """A window's geometry (kernel_size, stride, padding or dilation of a convolution or a
    pooling, layers and kernels alike): an int or a length-``n`` sequence of ints in
    [``low``, ``MAX_GEOMETRY``], returned as a tuple of ``n`` ints."""
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool):
        value = (value,) * n
    if not isinstance(value, (tuple, list)) or len(value) != n:
        raise TypeError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
    for v in value:
        check_scalar(v, name=name, kind=numbers.Integral, low=low)
        if v > MAX_GEOMETRY:
            raise ValueError(f"{name} must be at most 2**31 - 1 = {MAX_GEOMETRY}, got "
                             f"{value!r}")
    return tuple(int(v) for v in value)


def axis_or_dim(axis, dim, *, default, op: str):
    """The axis given as NumPy's ``axis`` or torch's ``dim`` (both accepted, one at a time);
    ``default`` when neither is given."""
    if axis is not None and dim is not None:
        raise TypeError(f"{op}: pass axis (NumPy's name) or dim (torch's), not both; got "
                        f"axis={axis!r}, dim={dim!r}")
    return default if axis is None and dim is None else (dim if axis is None else axis)


def check_choice(value, *, name: str, choices) -> str:
    """``value`` if it is one of ``choices``; a ``TypeError`` when it is not even of their
    type (None where strings are expected), else a ``ValueError``; both name ``name``."""
    if not any(_same_choice(value, c) for c in choices):
        options = ", ".join(repr(c) for c in choices)
        if not any(type(value) is type(c) for c in choices):
            raise TypeError(f"{name} must be one of {options}; got {value!r} "
                            f"({type(value).__name__})")
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def _same_choice(value, choice) -> bool:
    """``value == choice``, a bool only equal to a bool (True is not 1), arrays to nothing."""
    is_bool = isinstance(value, (bool, np.bool_))
    if is_bool != isinstance(choice, bool) or np.ndim(value) != 0:
        return False
    try:
        return bool(value == choice)
    except (TypeError, ValueError):
        return False


def check_bool(value, *, name: str) -> bool:
    """``value`` as a bool; a ``TypeError`` naming ``name`` unless it is a (NumPy) bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_real(x, *, name: str, op: str):
    """Raise ``TypeError`` when ``x`` (an array or Tensor) is complex; return it unchanged.

    For ops whose math needs real numbers (an ordering, a probability, a real loss); the
    message names the op and the argument, e.g. "relu: x must be real (float32/float64),
    got complex128".
    """
    if np.dtype(x.dtype).kind == "c":
        raise TypeError(f"{op}: {name} must be real (float32/float64), got {x.dtype}")
    return x


def check_input_dtype(x, expected, *, name: str, owner: str):
    """Raise ``TypeError`` unless the input ``x`` has the dtype of ``owner``'s parameters.

    The message names the user's argument and both ways out: cast the input, or (for a
    floating-point input) the module with ``.double()`` / ``.float()``.
    """
    expected = np.dtype(expected)
    if np.dtype(x.dtype) == expected:
        return x
    fix = f"cast {name} with {name}.astype(np.{expected.name})"
    module_cast = {"float32": ".float()", "float64": ".double()"}.get(np.dtype(x.dtype).name)
    if module_cast is not None and np.dtype(x.dtype).isnative:  # not for a '>f8' x
        fix += f", or the {owner} module with {module_cast} (or .to(np.{x.dtype}))"
    raise TypeError(f"{name} has dtype {describe_dtype(x.dtype)} but {owner}'s parameters "
                    f"are {expected}; {fix}")
