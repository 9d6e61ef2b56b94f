"""What the stand-in's device would run: every CuPy operation counted as the kernels (or
memory operations) CuPy makes of it on a GPU.

``count_operations()`` is a context manager yielding a Counter ``{kind: count}`` of the
operations made inside its block (nested blocks all count). Kinds:

- ``kernel:<name>``: a CuPy kernel: an elementwise ufunc call or operator (``ufunc:add``, in
  place too), a reduction (``sum``, ``max``, ...), a matrix product (``matmul``), a cast
  (``astype``), a gather (``getitem``), an assignment (``setitem``), ``concatenate``,
  ``where``, a non-zero fill, an ``ElementwiseKernel`` call, ``scatter_add``, a random draw;
  one kernel each (cuBLAS may run two for a product; CuPy's ``sum`` one or two);
- ``memset:<name>``: zeros, ``fill(0)``, ``full(..., 0)`` (CuPy: cudaMemsetAsync);
- ``memcpy:<name>``: a copy of a C-contiguous array (D2D), an upload of host data (H2D).

Views (``reshape``, ``transpose``, basic slicing, ``broadcast_to``, ``split``...) and
``empty`` are no device work: an operation whose array results all share memory with an
operand counts nothing. Numba launches are counted by ``nnkit._ext._launch``
(tests/helpers.py ``count_device_work`` joins both).

GPU-profiler kernel counts (``benchmarks/bench_gpu.py``, steps) leave out Memcpy and Memset,
as ``kernels()`` does here.
"""

from __future__ import annotations

import collections
import contextlib

import numpy as _np

_recorders: tuple = ()

_FREE = frozenset({"empty", "empty_like", "ndarray"})
_MEMSET = frozenset({"zeros", "zeros_like"})
_FILLS = frozenset({"full", "full_like", "fill"})


@contextlib.contextmanager
def count_operations():
    """Yield a Counter {kind: count} of the device operations made inside the block."""
    global _recorders
    counts = collections.Counter()
    _recorders = (*_recorders, counts)
    try:
        yield counts
    finally:
        _recorders = tuple(r for r in _recorders if r is not counts)


def kernels(counts) -> int:
    """The kernels of a Counter of ``count_operations`` (memsets and memcpys left out)."""
    return sum(n for kind, n in counts.items() if kind.startswith("kernel:"))


def record(kind: str) -> None:
    for counts in _recorders:
        counts[kind] += 1


def recording() -> bool:
    return bool(_recorders)


def _buffers(values):
    for v in values:
        if isinstance(v, _np.ndarray):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _buffers(v)


def function(fn, name, args, kwargs, result) -> None:
    """Record a NumPy function (or array method) ``fn`` called ``name`` run on device
    operands (their buffers in ``args``/``kwargs``) that gave ``result`` (NumPy)."""
    if not _recorders or name in _FREE:
        return
    if isinstance(fn, _np.ufunc):  # cupy.add(a, b, out=c) and the like: one kernel
        ufunc(fn, "__call__")
        return
    if kwargs.get("out") is not None:
        record(f"kernel:{name}")
        return
    if name in _MEMSET:
        record(f"memset:{name}")
        return
    if name in _FILLS:
        value = args[-1] if name == "fill" else kwargs.get("fill_value", args[1] if len(args) > 1
                                                                else None)
        zero = value is not None and _np.ndim(value) == 0 and value == 0
        record(f"memset:{name}" if zero else f"kernel:{name}")
        return
    if result is None:  # an in-place operation (copyto, put, sort, ...)
        record(f"kernel:{name}")
        return
    outs = list(_buffers([result]))
    if not outs:
        if isinstance(result, _np.generic):
            record(f"kernel:{name}")  # a reduction to a scalar
        return  # shapes, dtypes, Python values: host work
    ins = list(_buffers([getattr(fn, "__self__", None), args, list(kwargs.values())]))
    if all(any(_np.may_share_memory(o, i) for i in ins) for o in outs):
        return  # a view of an operand
    if name == "copy" and ins and ins[0].flags.c_contiguous:
        record("memcpy:copy")
        return
    record(f"kernel:{name}")


def ufunc(uf, method) -> None:
    if _recorders:
        name = "matmul" if uf is _np.matmul else f"ufunc:{uf.__name__}"
        record(f"kernel:{name}" if method == "__call__" else f"kernel:{name}.{method}")


def getitem(source, result) -> None:
    """A gather when the result is not a view of ``source``."""
    if _recorders and isinstance(result, _np.ndarray) and \
            not _np.may_share_memory(result, source):
        record("kernel:getitem")
