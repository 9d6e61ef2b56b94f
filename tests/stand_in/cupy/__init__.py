"""A NumPy-backed stand-in for CuPy: runs nnkit's GPU code paths (CuPy arrays in, Numba CUDA
kernels under ``NUMBA_ENABLE_CUDASIM=1``) on a machine without a GPU.

Only tests use it: ``NNKIT_CUPY_STAND_IN=1`` (with the simulator on) puts this folder's
parent first on ``sys.path`` (tests/conftest.py), so ``import cupy`` finds it, and the tests
marked ``cuda`` run. ``tests/test_gpu_stand_in.py`` does that in a child process.

What it keeps of CuPy's contract, so code that breaks it fails here as it would on a GPU:

- ``ndarray`` is its own type, not a NumPy array (``nnkit._backend.is_gpu_array``), with a
  ``__cuda_array_interface__``;
- implicit conversion to NumPy is refused (``np.asarray(x)`` raises TypeError, as CuPy's
  ``__array__``); NumPy array operands of CuPy functions, ufuncs and operators are refused
  (TypeError, as CuPy's kernels refuse them); host data enters only through ``asarray`` /
  ``array`` (uploads), and leaves only through ``get``, ``asnumpy``, ``item``, ``tolist``,
  ``float``/``int``/``bool`` — each declared to ``_core.syncdetect`` as CuPy does;
- reductions and integer indexing give 0-d arrays, not NumPy scalars;
- ``ElementwiseKernel`` runs only kernels it has a NumPy twin for (``_ELEMENTWISE_TWINS``).

It runs only under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1``; ImportError otherwise),
which it teaches on import to launch kernels on its arrays (``_simulator``).
"""

from __future__ import annotations

import os
import sys
import types

import numpy as _np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import _core, _counting, _simulator, cuda, random, testing  # noqa: F401  (CuPy's submodules)
from ._counting import count_operations  # noqa: F401  (the stand-in's own)

__version__ = "0.0-stand-in"


def _declare_synchronize():
    """Looked up at every call, so a test's wrapper of CuPy's hook sees the stand-in's."""
    _core.syncdetect._declare_synchronize()


class ndarray(NDArrayOperatorsMixin):  # noqa: N801  (CuPy's name)
    """A device array: a NumPy buffer that only CuPy-style operations may touch."""

    __array_priority__ = 100

    def __init__(self, shape, dtype=float, order="C"):
        self._a = _np.empty(shape, dtype=dtype, order=order)

    @classmethod
    def _of(cls, buffer: _np.ndarray) -> ndarray:
        out = object.__new__(cls)
        out._a = buffer
        return out

    # ----- what CuPy refuses ----------------------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_device_operand(o) for o in kwargs["out"])
        result = getattr(ufunc, method)(*(_device_operand(x) for x in inputs), **kwargs)
        _counting.ufunc(ufunc, method)
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        ours = getattr(sys.modules[__name__], func.__name__, None)
        if ours is None or not callable(ours):
            return NotImplemented
        return ours(*args, **kwargs)

    # ----- device-to-host, each a synchronisation ----------------------------------------------
    def get(self, stream=None, order="C", out=None):
        _declare_synchronize()
        if out is not None:
            out[...] = self._a
            return out
        return _np.array(self._a, order=order)

    def item(self):
        _declare_synchronize()
        return self._a.item()

    def tolist(self):
        _declare_synchronize()
        return self._a.tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __complex__(self):
        return complex(self.item())

    def __bool__(self):
        _declare_synchronize()
        return bool(self._a)

    def __index__(self):
        if self._a.dtype.kind not in "iub":
            raise TypeError("only integer arrays can be used as an index")
        return int(self.item())

    # ----- the rest: NumPy's, on device operands ------------------------------------------------
    @property
    def __cuda_array_interface__(self):
        face = dict(self._a.__array_interface__)
        face.update(version=3, stream=None)
        return face

    @property
    def device(self):
        return cuda.Device(0)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self._a.ctypes.data)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(row) for row in self._a)

    def __repr__(self):
        return f"stand-in cupy.{self._a!r}"

    def __getitem__(self, index):
        result = self._a[_index_operand(index)]
        _counting.getitem(self._a, result)
        return _wrap(result)

    def __setitem__(self, index, value):
        self._a[_index_operand(index)] = _device_operand(value, uploads=True)
        _counting.record("kernel:setitem")

    def __copy__(self):
        _counting.record("memcpy:copy")
        return _wrap(self._a.copy())

    def __deepcopy__(self, memo):
        _counting.record("memcpy:copy")
        return _wrap(self._a.copy())

    def __getstate__(self):
        raise TypeError("the CuPy stand-in does not pickle device arrays")

    def __getattr__(self, name):
        if name == "_a" or name.startswith("__"):  # NumPy's __array_interface__ and the like
            raise AttributeError(name)
        value = getattr(self._a, name)
        if callable(value):
            return _device_function(value)
        return _wrap(value)

    def __setattr__(self, name, value):
        if name == "_a":
            object.__setattr__(self, name, value)
        elif name == "shape":
            self._a.shape = value
        else:
            raise AttributeError(f"cannot set {name!r} of a device array")


def _wrap(value):
    """NumPy results as device arrays (scalars as 0-d arrays, as CuPy's reductions)."""
    if isinstance(value, _np.ndarray):
        return ndarray._of(value)
    if isinstance(value, _np.generic) and not isinstance(value, _np.dtype):
        return ndarray._of(_np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _device_operand(value, uploads=False):
    """The NumPy buffer of a device array; Python and NumPy scalars as they are; NumPy arrays
    refused (TypeError, as CuPy), unless ``uploads`` (assignment of host data, a copy)."""
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, _np.ndarray):
        if uploads:
            return asarray(value)._a
        raise TypeError(f"Unsupported type {type(value)} (the CuPy stand-in, as CuPy, does "
                        "not mix NumPy arrays into device operations)")
    if isinstance(value, (list, tuple)):
        return type(value)(_device_operand(v, uploads) for v in value)
    if _is_simulator_array(value):
        return _simulator_buffer(value)
    return value


def _index_operand(index):
    """An index: device arrays by their buffer; host integer arrays allowed (CuPy uploads
    them); slices, ints, None, Ellipsis as they are."""
    if isinstance(index, tuple):
        return tuple(_index_operand(i) for i in index)
    if isinstance(index, ndarray):
        return index._a
    if isinstance(index, _np.ndarray):
        return asarray(index)._a
    return index


def _device_function(fn):
    """``fn`` of NumPy, on device operands, with device results."""
    def on_device(*args, **kwargs):
        args = tuple(_device_operand(a) for a in args)
        kwargs = {k: _device_operand(v) for k, v in kwargs.items()}
        result = fn(*args, **kwargs)
        _counting.function(fn, on_device.__name__, args, kwargs, result)
        return _wrap(result)

    on_device.__name__ = getattr(fn, "__name__", "function")
    return on_device


# ----- simulator device arrays (Numba's ``cuda.device_array`` under NUMBA_ENABLE_CUDASIM) ------
def _is_simulator_array(value) -> bool:
    return type(value).__name__ == "FakeCUDAArray"


def _simulator_buffer(value) -> _np.ndarray:
    return value._ary


# ----- host to device ----------------------------------------------------------------------
def asarray(a, dtype=None, order=None, *, blocking=False):
    """A device array of ``a``: a device array as it is (or cast); host data uploaded (a
    copy); a Numba device array shared, as CuPy reads its ``__cuda_array_interface__``."""
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    if _is_simulator_array(a):
        return asarray(ndarray._of(_simulator_buffer(a)), dtype)
    _counting.record("memcpy:upload")
    return ndarray._of(_np.array(a, dtype=dtype, order=order or "K", copy=True))


def array(obj, dtype=None, copy=True, order="K", ndmin=0, *, blocking=False):
    if isinstance(obj, ndarray):
        result = _np.array(obj._a, dtype=dtype, copy=copy, order=order, ndmin=ndmin)
        _counting.function(None, "array" if result.dtype != obj._a.dtype else "copy",
                           (obj._a,), {}, result)
        return _wrap(result)
    _counting.record("memcpy:upload")
    return ndarray._of(_np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin))


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return _np.asarray(a, order=order)


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, ndarray):
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy.ndarray, got "
                        f"{type(a).__name__})")
    result = _np.ascontiguousarray(a._a, dtype=dtype)
    _counting.function(None, "ascontiguousarray", (a._a,), {}, result)
    return _wrap(result)


def get_default_memory_pool():
    return types.SimpleNamespace(used_bytes=lambda: 0, total_bytes=lambda: 0,
                                 free_all_blocks=lambda: None)


# ----- ElementwiseKernel: only those with a NumPy twin -----------------------------------------
def _splitmix_uniform(seed, u):
    """nnkit._ext.elementwise_cuda's uniform kernel: u[i] = splitmix64(seed + (i + 1) *
    gamma) >> 11 times 2**-53 (its CUDA C body, in NumPy's wrapping uint64 arithmetic)."""
    with _np.errstate(over="ignore"):
        z = _np.uint64(seed) + (_np.arange(u.size, dtype=_np.uint64) + _np.uint64(1)) * \
            _np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _np.uint64(30))) * _np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _np.uint64(27))) * _np.uint64(0x94D049BB133111EB)
        z ^= z >> _np.uint64(31)
    u.reshape(-1)[...] = (z >> _np.uint64(11)).astype(_np.float64) * 2.0**-53


_ELEMENTWISE_TWINS = {"nnkit_splitmix_uniform": _splitmix_uniform}


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", **kwargs):
        if name not in _ELEMENTWISE_TWINS:
            raise NotImplementedError(f"the CuPy stand-in has no NumPy twin for the "
                                      f"ElementwiseKernel {name!r}")
        self._twin, self._name = _ELEMENTWISE_TWINS[name], name

    def __call__(self, *args):
        self._twin(*(_device_operand(a) for a in args))
        _counting.record(f"kernel:{self._name}")


# ----- everything else: NumPy's functions on device operands, NumPy's types and constants -----
def __getattr__(name):
    if name.startswith("__") or not hasattr(_np, name):
        raise AttributeError(f"the CuPy stand-in has no {name!r}")
    value = getattr(_np, name)
    if callable(value) and not isinstance(value, type):
        return _device_function(value)
    return value  # types (float32, ...), constants (nan, inf, newaxis)


if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    raise ImportError("the CuPy stand-in (tests/stand_in) runs only under Numba's CUDA "
                      "simulator: set NUMBA_ENABLE_CUDASIM=1")
_simulator.install(ndarray)
