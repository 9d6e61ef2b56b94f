"""Naive twins of the softmax family: softmax, log_softmax and cross-entropy over rows.

Rows are the last axis; cross-entropy takes logits ``(N, C)`` and integer targets ``(N,)``.
Computed in float64 with the textbook max-shift, cast back to the input's dtype. The pairs
mirror ``nnkit.kernels.softmax``'s: ``<op>_forward`` returns ``(out, cache)`` and
``<op>_backward(dy, cache)`` the input's gradient; the plain ``softmax``, ``log_softmax``
and ``cross_entropy`` give the value alone.
"""

from __future__ import annotations

import math

import numpy as np

from ..._types import Array

__all__ = ["softmax", "softmax_forward", "softmax_backward", "log_softmax",
           "log_softmax_forward", "log_softmax_backward", "cross_entropy",
           "cross_entropy_forward", "cross_entropy_backward"]


def _rows(x):
    """View ``x`` (..., D) as float64 rows (M, D)."""
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(-1, x.shape[-1]) if x.ndim > 0 else x.reshape(1, 1)


def softmax(x: Array) -> Array:
    """y_ij = exp(x_ij - max_k x_ik) / sum_k exp(x_ik - max_k x_ik), over the last axis."""
    x = np.asarray(x)
    rows = _rows(x)
    out = np.empty_like(rows)
    for i in range(rows.shape[0]):
        m = max(rows[i]) if rows.shape[1] else 0.0
        e = [math.exp(v - m) for v in rows[i]]
        s = sum(e)
        out[i] = [v / s for v in e]
    return out.reshape(x.shape).astype(x.dtype)


def softmax_forward(x: Array) -> tuple[Array, Array]:
    """(y, cache): ``softmax(x)``, and y itself as the cache."""
    y = softmax(x)
    return y, y


def softmax_backward(dy: Array, cache: Array) -> Array:
    """dx_ij = y_ij (dy_ij - sum_k dy_ik y_ik): the softmax Jacobian applied to dy; ``cache``
    the y of ``softmax_forward``."""
    y = np.asarray(cache)
    dyr, yr = _rows(dy), _rows(y)
    dx = np.empty_like(yr)
    for i in range(yr.shape[0]):
        dot = sum(a * b for a, b in zip(dyr[i], yr[i], strict=True))
        dx[i] = [yv * (dv - dot) for dv, yv in zip(dyr[i], yr[i], strict=True)]
    return dx.reshape(y.shape).astype(y.dtype)


def log_softmax(x: Array) -> Array:
    """y_ij = x_ij - m_i - log sum_k exp(x_ik - m_i), m_i = max_k x_ik."""
    x = np.asarray(x)
    rows = _rows(x)
    out = np.empty_like(rows)
    for i in range(rows.shape[0]):
        m = max(rows[i]) if rows.shape[1] else 0.0
        lse = m + math.log(sum(math.exp(v - m) for v in rows[i])) if rows.shape[1] else 0.0
        out[i] = [v - lse for v in rows[i]]
    return out.reshape(x.shape).astype(x.dtype)


def log_softmax_forward(x: Array) -> tuple[Array, Array]:
    """(y, cache): ``log_softmax(x)``, and y itself as the cache."""
    y = log_softmax(x)
    return y, y


def log_softmax_backward(dy: Array, cache: Array) -> Array:
    """dx_ij = dy_ij - exp(y_ij) sum_k dy_ik; ``cache`` the y = log_softmax(x) of
    ``log_softmax_forward``."""
    y = np.asarray(cache)
    dyr, yr = _rows(dy), _rows(y)
    dx = np.empty_like(yr)
    for i in range(yr.shape[0]):
        s = sum(dyr[i])
        dx[i] = [dv - math.exp(yv) * s for dv, yv in zip(dyr[i], yr[i], strict=True)]
    return dx.reshape(y.shape).astype(y.dtype)


def cross_entropy(logits: Array, target: Array, ignore_index: int = -100) -> Array:
    """Mean over the non-ignored rows of -log softmax(logits)_i[target_i] (torch's 'mean').

    Returns a 0-d array of the logits' dtype; NaN when every row is ignored (as torch).
    """
    logits = np.asarray(logits)
    lp = _rows(log_softmax(logits.astype(np.float64)))
    total, count = 0.0, 0
    for i, t in enumerate(np.asarray(target)):
        if t == ignore_index:
            continue
        total -= lp[i, t]
        count += 1
    value = total / count if count else math.nan
    return np.asarray(value, dtype=logits.dtype)


def cross_entropy_forward(logits: Array, target: Array, ignore_index: int = -100,
                          ) -> tuple[Array, tuple[Array, Array, int]]:
    """(loss, cache): ``cross_entropy``'s loss, and its arguments as the cache."""
    return cross_entropy(logits, target, ignore_index), (logits, target, ignore_index)


def cross_entropy_backward(dloss: Array, cache: tuple[Array, Array, int]) -> Array:
    """d/dlogits of the mean cross-entropy: (softmax(logits)_i - onehot(target_i)) dloss /
    n_valid; ``cache`` (logits, target, ignore_index) of ``cross_entropy_forward``."""
    logits, target, ignore_index = cache
    logits = np.asarray(logits)
    target = np.asarray(target)
    p = _rows(softmax(logits.astype(np.float64)))
    count = int(sum(1 for t in target if t != ignore_index))
    grad = np.zeros_like(p)
    for i, t in enumerate(target):
        if t == ignore_index:
            continue
        grad[i] = p[i]
        grad[i, t] -= 1.0
        grad[i] *= float(dloss) / count
    return grad.astype(logits.dtype)
