"""Softmax, log-softmax and cross-entropy: validated forward/backward pairs with backend
dispatch.

Each function checks its inputs once (``nnkit._validation``), moves ``axis`` last and
views the array as rows ``(M, C)`` (C the softmax axis), then runs a row kernel:
``nnkit._ext.softmax_cpu`` (Numba) for NumPy arrays, ``nnkit._ext.softmax_cuda`` (Numba
CUDA, imported lazily) for GPU arrays, chosen by ``nnkit._backend.kernels_for``. Both
expose the same launchers.

Numerics: every kernel shifts by the row maximum; cross-entropy is fused (one pass per row
computes the maximum, the log-sum-exp and the loss; no softmax is stored) and stays finite
at logits of +-1e4. A row of -inf (or holding NaN) gives NaN, as torch does.

Backend on the CPU: the Numba kernels (``softmax_cpu.softmax_rows``: a vectorised
polynomial exp, prange over rows), at 53-76% of the memory-bandwidth bound and faster than
torch.softmax and NumPy. The Cython kernel (``softmax_cy.softmax_rows``: libm ``expf``,
which gcc without ``-march`` flags does not vectorise; one thread, setup.py has no OpenMP)
is about 10x slower and stays as a tested second implementation (``tests/test_softmax.py``
holds both to the naive twin). Figures: benchmarks/RESULTS.md, "Row softmax".

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.softmax import softmax_forward, cross_entropy_forward
>>> y = softmax_forward(np.array([[0.0, 0.0]], dtype=np.float32))
>>> y.tolist()
[[0.5, 0.5]]
>>> loss, lse = cross_entropy_forward(np.zeros((2, 4)), np.array([1, -100]))
>>> round(float(loss), 6)
1.386294
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._backend import array_module, is_gpu_array, kernels_for
from .._validation import (
    FLOATS,
    INTEGERS,
    axis_or_dim,
    check_array,
    check_out,
    check_same_device,
    check_same_dtype,
    check_same_shape,
    check_scalar,
)

__all__ = [
    "softmax_forward",
    "softmax_backward",
    "log_softmax_forward",
    "log_softmax_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "cross_entropy_forward_gpu",
    "cross_entropy_backward_gpu",
]


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


def _check_pair(dy, y):
    """Validate a (dy, y) pair: float arrays of one shape, dtype and device."""
    y = check_array(y, name="y", min_ndim=1, dtype=FLOATS)
    dy = check_array(dy, name="dy", min_ndim=1, dtype=FLOATS)
    check_same_device(dy, y, name="dy", like_name="y")
    check_same_shape(dy, y, name_a="dy", name_b="y")
    check_same_dtype(dy, y, name="dy", like_name="y")
    return dy, y


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


def softmax_forward(x, axis=None, out=None, *, dim=None):
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
    y : ndarray, ``x``'s shape and dtype.
    """
    x = check_array(x, name="x", min_ndim=1, dtype=FLOATS)
    axis = _check_axis(axis_or_dim(axis, dim, default=-1, op="softmax"), x.ndim)
    out = None if out is None else check_out(out, x)
    return _rowwise(_kernels(x).softmax_rows, (x,), axis, out)


def log_softmax_forward(x, axis=None, out=None, *, dim=None):
    """Log-softmax over ``axis``: y = x - max x - log sum exp(x - max x).

    Same arguments and result as ``softmax_forward``.
    """
    x = check_array(x, name="x", min_ndim=1, dtype=FLOATS)
    axis = _check_axis(axis_or_dim(axis, dim, default=-1, op="softmax"), x.ndim)
    out = None if out is None else check_out(out, x)
    return _rowwise(_kernels(x).log_softmax_rows, (x,), axis, out)


def softmax_backward(dy, y, axis=None, *, dim=None):
    """Gradient of softmax: dx = y * (dy - sum(dy * y, axis)).

    ``dy`` the upstream gradient and ``y = softmax_forward(x, axis)``, one shape and float
    dtype. Returns dx of that shape and dtype.
    """
    dy, y = _check_pair(dy, y)
    axis = _check_axis(axis_or_dim(axis, dim, default=-1, op="softmax"), y.ndim, "y")
    return _rowwise(_kernels(y, "y").softmax_backward_rows, (dy, y), axis, None)


def log_softmax_backward(dy, y, axis=None, *, dim=None):
    """Gradient of log-softmax: dx = dy - exp(y) * sum(dy, axis).

    ``dy`` the upstream gradient and ``y = log_softmax_forward(x, axis)``, one shape and
    float dtype. Returns dx of that shape and dtype.
    """
    dy, y = _check_pair(dy, y)
    axis = _check_axis(axis_or_dim(axis, dim, default=-1, op="softmax"), y.ndim, "y")
    return _rowwise(_kernels(y, "y").log_softmax_backward_rows, (dy, y), axis, None)


def _check_ce(logits, target, ignore_index):
    """Validate cross-entropy inputs; return (logits, target as int64, n_valid)."""
    logits = check_array(logits, name="logits", ndim=2, dtype=FLOATS)
    target = check_array(target, name="target", ndim=1, dtype=INTEGERS)
    check_scalar(ignore_index, name="ignore_index", kind=numbers.Integral)
    check_same_device(target, logits, name="target", like_name="logits")
    N, C = logits.shape
    if target.shape[0] != N:
        raise ValueError(
            f"target has {target.shape[0]} entries but logits has {N} rows; "
            f"expected target of shape ({N},)"
        )
    xp = array_module(logits)
    valid = target != ignore_index
    bad = xp.flatnonzero(valid & ((target < 0) | (target >= C)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"target[{i}] = {int(target[i])} is out of range for logits with C={C} classes; "
            f"expected values in [0, {C}) or ignore_index={ignore_index}"
        )
    n_valid = int(valid.sum())
    return logits, xp.ascontiguousarray(target.astype(np.int64)), n_valid


def cross_entropy_forward(logits, target, ignore_index=-100):
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
    lse : ndarray (N,) float64 (for both dtypes), the row log-sum-exp: the cache for the
        backward, kept in float64 so that exp(logits - lse) stays exact at logits ~ 1e4.
    """
    logits, target, n_valid = _check_ce(logits, target, ignore_index)
    xp = array_module(logits)
    N, C = logits.shape
    # float64 for both dtypes: lse ~ 1e4 in float32 would leave the backward's exp(x - lse)
    # only 3 correct digits
    lse = xp.empty((N,), dtype=np.float64)
    loss_rows = xp.empty((N,), dtype=np.float64)
    if C == 0:  # every row is ignored (checked above): log of an empty sum
        lse.fill(-math.inf)
        loss_rows.fill(0.0)
    elif N:
        _kernels(logits, "logits").cross_entropy_rows(logits, target, int(ignore_index), lse,
                                                      loss_rows)
    total = float(loss_rows.sum(dtype=np.float64)) if N else 0.0
    loss = total / n_valid if n_valid else math.nan
    return xp.asarray(loss, dtype=logits.dtype), lse


def cross_entropy_backward(dloss, logits, target, lse, ignore_index=-100):
    """Gradient of the mean cross-entropy with respect to ``logits``.

    dlogits_i = (softmax(logits_i) - onehot(target_i)) * dloss / n_valid, and 0 on rows
    whose target is ``ignore_index`` (all zeros when every row is ignored).

    Parameters
    ----------
    dloss : float or 0-d array, the upstream gradient of the loss
    logits, target, ignore_index : as in ``cross_entropy_forward``
    lse : ndarray (N,) float64 (or ``logits``' dtype), from ``cross_entropy_forward``

    Returns
    -------
    dlogits : ndarray (N, C) of ``logits``' dtype.
    """
    logits, target, n_valid = _check_ce(logits, target, ignore_index)
    lse = check_array(lse, name="lse", ndim=1, dtype=FLOATS)
    check_same_device(lse, logits, name="lse", like_name="logits")
    N, C = logits.shape
    if lse.shape[0] != N:
        raise ValueError(f"lse has shape {tuple(lse.shape)}; expected ({N},), one per row")
    if lse.dtype != logits.dtype and lse.dtype != np.float64:
        raise TypeError(
            f"lse has dtype {lse.dtype} but logits has dtype {logits.dtype}; expected float64 "
            "(as cross_entropy_forward returns it) or the logits' dtype"
        )
    if is_gpu_array(dloss):
        dloss = float(dloss)
    dloss_arr = check_array(dloss, name="dloss", ndim=0, dtype=FLOATS + INTEGERS)
    dloss = float(dloss_arr)
    xp = array_module(logits)
    out = xp.empty((N, C), dtype=logits.dtype)
    if out.size:
        scale = dloss / n_valid if n_valid else 0.0
        _kernels(logits, "logits").cross_entropy_backward_rows(
            logits, target, lse, scale, int(ignore_index), out
        )
    return out


def cross_entropy_forward_gpu(logits, target, ignore_index=-100):
    """The mean cross-entropy of GPU ``logits`` (N, C) without a host round trip.

    ``cross_entropy_forward`` reads the targets and the count of valid rows on the host to
    validate them, which waits for the device; here the count stays a device scalar, so a
    target outside [0, C) gives a NaN loss instead of a ``ValueError``.

    Returns
    -------
    loss : 0-d device array of ``logits``' dtype (NaN when every row is ignored)
    cache : (logits C-contiguous, target as int64, lse (N,) float64, n_valid (1,) float64),
        for ``cross_entropy_backward_gpu``
    """
    logits = check_array(logits, name="logits", ndim=2, dtype=FLOATS)
    kernels = kernels_for(None, "softmax_cuda", logits, name="logits")
    check_same_device(target, logits, name="target", like_name="logits")
    xp = array_module(logits)
    t = xp.ascontiguousarray(target.astype(np.int64, copy=False))
    N = logits.shape[0]
    lse = xp.empty((N,), dtype=np.float64)  # float64 as the CPU kernel's cache
    loss_rows = xp.empty((N,), dtype=np.float64)  # NaN where the target is out of range
    kernels.cross_entropy_rows(logits, t, ignore_index, lse, loss_rows)
    loss = xp.empty((1,), dtype=logits.dtype)  # 0 / 0 = NaN: every row ignored
    n_valid = xp.empty((1,), dtype=np.float64)  # stays on the device, for the backward
    kernels.cross_entropy_mean(loss_rows, t, ignore_index, loss, n_valid)
    return loss.reshape(()), (logits, t, lse, n_valid)


def cross_entropy_backward_gpu(dloss, cache, ignore_index=-100):
    """Gradient of ``cross_entropy_forward_gpu``'s loss with respect to its ``logits``, with
    the upstream gradient ``dloss`` and the count of valid rows kept on the device."""
    logits, t, lse, n_valid = cache
    kernels = kernels_for(None, "softmax_cuda", logits, name="logits")
    xp = array_module(logits)
    out = xp.empty_like(logits)
    kernels.cross_entropy_mean_backward_rows(logits, t, lse, xp.ascontiguousarray(dloss).reshape(1),
                                             n_valid, ignore_index, out)
    return out
