"""Softmax, log-softmax and cross-entropy: validated forward/backward pairs with backend
dispatch.

Each forward checks its inputs once (``nnkit._validation``), moves ``axis`` last and
views the array as rows ``(M, C)`` (C the softmax axis), then runs a row kernel:
``nnkit._ext.softmax_cpu`` (Numba) for NumPy arrays, ``nnkit._ext.softmax_cuda`` (Numba
CUDA, imported lazily) for GPU arrays, chosen by ``nnkit._backend.kernels_for``. Both
expose the same launchers.

Numerics: every kernel shifts by the row maximum; cross-entropy is fused (one pass per row
computes the maximum, the log-sum-exp and the loss; no softmax is stored) and stays finite
at logits of +-1e4. A row of -inf (or holding NaN) gives NaN, as torch does.

Backend on the CPU: the Numba kernels (``softmax_cpu.softmax_rows``: a vectorised
polynomial exp, prange over rows), near the memory-bandwidth bound and faster than
torch.softmax and NumPy (benchmarks/RESULTS.md, "Row softmax").

Each forward returns ``(out, cache)`` and each backward takes ``(dy, cache, needs=None)``
and returns the gradient of the forward's one input (which always needs it): the cache
holds what the backward reads (softmax's output and axis; cross-entropy's logits, targets,
row log-sum-exp and count of valid rows) and the backward trusts it, checking only ``dy``.

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.softmax import cross_entropy_forward, softmax_backward, softmax_forward
>>> y, cache = softmax_forward(np.array([[0.0, 0.0]], dtype=np.float32))
>>> y.tolist()
[[0.5, 0.5]]
>>> softmax_backward(np.array([[1.0, 0.0]], dtype=np.float32), cache).tolist()
[[0.25, -0.25]]
>>> loss, cache = cross_entropy_forward(np.zeros((2, 4)), np.array([1, -100]))
>>> round(float(loss), 6)
1.386294
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from .._backend import array_module, backend, kernels_for
from .._types import Array, Needs
from .._validation import (
    FLOATS,
    INTEGERS,
    axis_or_dim,
    check_array,
    check_cache,
    check_grad,
    check_out,
    check_same_device,
    check_scalar,
)

__all__ = [
    "SoftmaxCache",
    "CrossEntropyCache",
    "softmax_forward",
    "softmax_backward",
    "log_softmax_forward",
    "log_softmax_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
]


class SoftmaxCache(NamedTuple):
    """What the (log-)softmax backward reads: the forward's output and its axis."""

    y: object  # the forward's output (softmax or log-softmax), x's shape and dtype
    axis: int  # non-negative
    log: bool  # made by log_softmax_forward


class CrossEntropyCache(NamedTuple):
    """What ``cross_entropy_backward`` reads."""

    logits: object  # (N, C), C-contiguous
    target: object  # (N,) int64, C-contiguous
    lse: object  # (N,) float64, the row log-sum-exp
    n_valid: object  # (1,) float64 on the logits' device: the count of non-ignored rows
    ignore_index: int


def _kernels(x, name="x"):
    """The launcher module for ``x``: the CUDA kernels for GPU arrays, else the CPU ones."""
    return kernels_for("softmax_cpu", "softmax_cuda", x, name=name)


def _check_axis(axis, ndim, name="x"):
    """``axis`` as a non-negative int in [0, ndim), or raise."""
    check_scalar(axis, name="axis", kind=numbers.Integral)
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis {axis} is out of range for {name} with {ndim} dimension(s); "
            f"expected an integer in [{-ndim}, {ndim - 1}]"
        )
    return int(axis) % ndim


def _as_rows(a, axis):
    """Move ``axis`` last and view as C-contiguous rows: (..., C, ...) -> (M, C)."""
    xp = array_module(a)
    moved = xp.moveaxis(a, axis, -1)  # (..., C)
    C = moved.shape[-1]
    M = math.prod(moved.shape[:-1])
    return xp.ascontiguousarray(moved).reshape(M, C), moved.shape


def _rowwise(launcher, inputs, axis, out):
    """Run ``launcher(*rows, out_rows)`` over ``axis`` of ``inputs`` (all one shape)."""
    first = inputs[0]
    xp = array_module(first)
    if out is not None and any(xp.may_share_memory(out, a) for a in inputs):
        # the kernels write a row of out while they read the row of x (log-softmax keeps its
        # exponentials in out): an out overlapping x, even x itself, gave wrong numbers. So
        # the result goes to a fresh array first, as NumPy's ufuncs do with such an out.
        out[...] = _rowwise(launcher, inputs, axis, None)
        return out
    if out is None:
        out = xp.empty(first.shape, dtype=first.dtype)
    if first.size == 0:
        return out
    rows = []
    for a in inputs:
        r, moved_shape = _as_rows(a, axis)
        rows.append(r)
    if axis == first.ndim - 1:
        launcher(*rows, out.reshape(rows[0].shape))  # a view: out is C-contiguous
        return out
    res = xp.empty(rows[0].shape, dtype=first.dtype)  # (M, C)
    launcher(*rows, res)
    out[...] = xp.moveaxis(res.reshape(moved_shape), -1, axis)
    return out


def _forward(x, axis, out, dim, log):
    """(y, cache) of the softmax or, with ``log``, the log-softmax of ``x`` over ``axis``."""
    x = check_array(x, name="x", min_ndim=1, dtype=FLOATS)
    axis = _check_axis(axis_or_dim(axis, dim, default=-1, op="softmax"), x.ndim)
    out = None if out is None else check_out(out, x)
    kernels = _kernels(x)
    y = _rowwise(kernels.log_softmax_rows if log else kernels.softmax_rows, (x,), axis, out)
    return y, SoftmaxCache(y, axis, log)


def _backward(dy, cache, log):
    """dx from ``dy`` and the (log-)softmax ``cache``; only ``dy`` is checked."""
    name = "log_softmax_forward" if log else "softmax_forward"
    y, axis, cache_log = check_cache(cache, SoftmaxCache, forward=name)
    if cache_log != log:
        raise TypeError(f"cache must be the SoftmaxCache returned by {name}, got the one of "
                        f"{'log_softmax_forward' if cache_log else 'softmax_forward'}")
    dy = check_grad(dy, shape=y.shape, dtype=y.dtype, device=backend(y))
    kernels = _kernels(y, "y")
    launcher = kernels.log_softmax_backward_rows if log else kernels.softmax_backward_rows
    return _rowwise(launcher, (dy, y), axis, None)


def softmax_forward(x: Array, axis: int | None = None, out: Array | None = None, *,
                    dim: int | None = None) -> tuple[Array, SoftmaxCache]:
    """Softmax over ``axis``: y = exp(x - max x) / sum exp(x - max x).

    Parameters
    ----------
    x : ndarray, float32 or float64, any shape with ndim >= 1
    axis : int, default -1
        The axis the probabilities sum over; ``dim`` (torch's name) is accepted instead.
    out : ndarray, optional
        Preallocated C-contiguous result of ``x``'s shape and dtype. It may overlap ``x``
        (``out=x`` for in place): the result is then computed aside and copied in.

    Returns
    -------
    y : ndarray, ``x``'s shape and dtype (``out`` when given).
    cache : SoftmaxCache
        For ``softmax_backward``: ``y`` itself (not a copy) and the axis.
    """
    return _forward(x, axis, out, dim, log=False)


def log_softmax_forward(x: Array, axis: int | None = None, out: Array | None = None, *,
                        dim: int | None = None) -> tuple[Array, SoftmaxCache]:
    """Log-softmax over ``axis``: y = x - max x - log sum exp(x - max x).

    Same arguments and results as ``softmax_forward`` (the cache for
    ``log_softmax_backward``).
    """
    return _forward(x, axis, out, dim, log=True)


def softmax_backward(dy: Array, cache: SoftmaxCache, needs: Needs = None) -> Array:
    """Gradient of softmax: dx = y * (dy - sum(dy * y, axis)).

    Parameters
    ----------
    dy : ndarray, the upstream gradient, the forward output's shape, dtype and device
    cache : SoftmaxCache from ``softmax_forward``
    needs : tuple of bool, optional
        ``nnkit.autograd.apply_op``'s mask of the inputs that need a gradient; the one
        input here always does.

    Returns
    -------
    dx : ndarray, ``dy``'s shape and dtype.
    """
    return _backward(dy, cache, log=False)


def log_softmax_backward(dy: Array, cache: SoftmaxCache, needs: Needs = None) -> Array:
    """Gradient of log-softmax: dx = dy - exp(y) * sum(dy, axis).

    Same arguments and result as ``softmax_backward``, with the cache of
    ``log_softmax_forward``.
    """
    return _backward(dy, cache, log=True)


def _check_ce(logits, target, ignore_index):
    """Validate cross-entropy inputs' types and shapes; return (logits, target as C-contiguous
    int64). The targets' values are read on the host only by ``_check_targets``."""
    logits = check_array(logits, name="logits", ndim=2, dtype=FLOATS)
    target = check_array(target, name="target", ndim=1, dtype=INTEGERS)
    check_scalar(ignore_index, name="ignore_index", kind=numbers.Integral)
    check_same_device(target, logits, name="target", like_name="logits")
    N = logits.shape[0]
    if target.shape[0] != N:
        raise ValueError(
            f"target has {target.shape[0]} entries but logits has {N} rows; "
            f"expected target of shape ({N},)"
        )
    xp = array_module(logits)
    return logits, xp.ascontiguousarray(target.astype(np.int64, copy=False))


def _check_targets(kernels, target, C, ignore_index):
    """A ``ValueError`` for a target outside [0, C) that the backend reads on the host
    (``first_invalid_target``; the CUDA kernels leave the targets on the device)."""
    i = kernels.first_invalid_target(target, C, ignore_index)
    if i is not None:
        raise ValueError(
            f"target[{i}] = {int(target[i])} is out of range for logits with C={C} classes; "
            f"expected values in [0, {C}) or ignore_index={ignore_index}"
        )


def cross_entropy_forward(logits: Array, target: Array, ignore_index: int = -100,
                          ) -> tuple[Array, CrossEntropyCache]:
    """Mean cross-entropy of ``logits`` against class indices ``target`` (torch's 'mean').

    loss = mean over i with target_i != ignore_index of (lse_i - logits[i, target_i]),
    lse_i = log sum_j exp(logits[i, j]).

    Parameters
    ----------
    logits : ndarray (N, C), float32 or float64
    target : ndarray (N,), integer, values in [0, C) or ``ignore_index``
    ignore_index : int
        Rows with this target take no part (as torch).

    Returns
    -------
    loss : 0-d ndarray of ``logits``' dtype; NaN when every row is ignored or N = 0.
    cache : CrossEntropyCache
        For ``cross_entropy_backward``. It keeps the row log-sum-exp ``lse`` (N,) in
        float64 for both dtypes, so that the backward's exp(logits - lse) stays exact at
        logits ~ 1e4 (in float32 only 3 digits would be left).

    On the GPU (CuPy logits and target) nothing is read on the host, so that the call does
    not wait for the device: the count of valid rows stays a device scalar, and a target
    outside [0, C) gives a NaN loss instead of a ``ValueError`` (torch reports it by a
    device-side assert).
    """
    logits, target = _check_ce(logits, target, ignore_index)
    ignore_index = int(ignore_index)
    xp = array_module(logits)
    N, C = logits.shape
    kernels = _kernels(logits, "logits")
    _check_targets(kernels, target, C, ignore_index)
    lse = xp.empty((N,), dtype=np.float64)
    loss_rows = xp.empty((N,), dtype=np.float64)  # NaN where a device target is out of range
    if C:
        kernels.cross_entropy_rows(logits, target, ignore_index, lse, loss_rows)
    else:  # no class: the log of an empty sum; a row not ignored has no valid target
        lse.fill(-math.inf)
        loss_rows[...] = xp.where(target == ignore_index, 0.0, math.nan)
    loss = xp.empty((1,), dtype=logits.dtype)  # 0 / 0 = NaN: every row ignored
    n_valid = xp.empty((1,), dtype=np.float64)  # kept for the backward, on the device
    kernels.cross_entropy_mean(loss_rows, target, ignore_index, loss, n_valid)
    return loss.reshape(()), CrossEntropyCache(logits, target, lse, n_valid, ignore_index)


def cross_entropy_backward(dloss: Array, cache: CrossEntropyCache, needs: Needs = None,
                           ) -> Array:
    """Gradient of the mean cross-entropy with respect to the forward's ``logits``.

    dlogits_i = (softmax(logits_i) - onehot(target_i)) * dloss / n_valid, and 0 on rows
    whose target is ``ignore_index`` (all zeros when every row is ignored).

    Parameters
    ----------
    dloss : float or 0-d array, the upstream gradient of the loss (a host number is
        uploaded when the forward ran on the GPU)
    cache : CrossEntropyCache from ``cross_entropy_forward``
    needs : tuple of bool, optional
        ``nnkit.autograd.apply_op``'s mask; the logits, the one input, always need theirs.

    Returns
    -------
    dlogits : ndarray (N, C) of ``logits``' dtype.
    """
    logits, target, lse, n_valid, ignore_index = check_cache(
        cache, CrossEntropyCache, forward="cross_entropy_forward")
    dloss = check_array(dloss, name="dloss", ndim=0, dtype=FLOATS + INTEGERS)
    xp = array_module(logits)
    dloss = xp.ascontiguousarray(xp.asarray(dloss)).reshape(1)  # dloss / n_valid: in the kernel
    out = xp.empty_like(logits)
    _kernels(logits, "logits").cross_entropy_mean_backward_rows(logits, target, lse, dloss,
                                                                n_valid, ignore_index, out)
    return out
