"""Naive twins of every kernel, written straight from the formula.

Plain loops over rows, computed in float64 (complex128 where complex) and cast back to
the input's dtype, with no stabilisation tricks beyond the textbook max-shift of softmax.
The tests hold ``nk.kernels`` to these; nothing here is meant to be fast.

Layouts: rows are the last axis (softmax, log_softmax, layer_norm over ``(M, D)``);
cross-entropy takes logits ``(N, C)`` and integer targets ``(N,)``.
"""

from __future__ import annotations

import math

import numpy as np

from .._random import splitmix64, uniform53

__all__ = [
    "softmax",
    "softmax_backward",
    "log_softmax",
    "log_softmax_backward",
    "cross_entropy",
    "cross_entropy_backward",
    "layer_norm",
    "layer_norm_backward",
    "gelu",
    "gelu_backward",
    "dropout_mask",
    "conv1d",
    "conv1d_backward",
    "conv2d",
    "conv2d_backward",
    "max_pool2d",
    "max_pool2d_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "linear_scan",
    "linear_scan_backward",
    "rnn",
    "rnn_backward",
    "lstm",
    "lstm_backward",
    "gru",
    "gru_backward",
    "attention_reference",
    "attention_reference_backward",
]


def _rows(x):
    """View ``x`` (..., D) as float64 rows (M, D)."""
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(-1, x.shape[-1]) if x.ndim > 0 else x.reshape(1, 1)


def softmax(x):
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


def softmax_backward(dy, y):
    """dx_ij = y_ij (dy_ij - sum_k dy_ik y_ik): the softmax Jacobian applied to dy."""
    y = np.asarray(y)
    dyr, yr = _rows(dy), _rows(y)
    dx = np.empty_like(yr)
    for i in range(yr.shape[0]):
        dot = sum(a * b for a, b in zip(dyr[i], yr[i], strict=True))
        dx[i] = [yv * (dv - dot) for dv, yv in zip(dyr[i], yr[i], strict=True)]
    return dx.reshape(y.shape).astype(y.dtype)


def log_softmax(x):
    """y_ij = x_ij - m_i - log sum_k exp(x_ik - m_i), m_i = max_k x_ik."""
    x = np.asarray(x)
    rows = _rows(x)
    out = np.empty_like(rows)
    for i in range(rows.shape[0]):
        m = max(rows[i]) if rows.shape[1] else 0.0
        lse = m + math.log(sum(math.exp(v - m) for v in rows[i])) if rows.shape[1] else 0.0
        out[i] = [v - lse for v in rows[i]]
    return out.reshape(x.shape).astype(x.dtype)


def log_softmax_backward(dy, y):
    """dx_ij = dy_ij - exp(y_ij) sum_k dy_ik (y = log_softmax(x))."""
    y = np.asarray(y)
    dyr, yr = _rows(dy), _rows(y)
    dx = np.empty_like(yr)
    for i in range(yr.shape[0]):
        s = sum(dyr[i])
        dx[i] = [dv - math.exp(yv) * s for dv, yv in zip(dyr[i], yr[i], strict=True)]
    return dx.reshape(y.shape).astype(y.dtype)


def cross_entropy(logits, target, ignore_index=-100):
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


def cross_entropy_backward(dloss, logits, target, ignore_index=-100):
    """d/dlogits of the mean cross-entropy: (softmax(logits)_i - onehot(target_i)) / n_valid."""
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


def gelu(x):
    """x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, elementwise in float64 (then x's dtype)."""
    from scipy.special import erf

    v = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        y = v * 0.5 * (1.0 + erf(v / math.sqrt(2.0)))
    y = np.where(np.abs(v) > 10, np.maximum(v, 0), y)  # relu there (and no -inf * 0)
    return y.astype(np.asarray(x).dtype)


def gelu_backward(g, x):
    """g (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), in float64."""
    from scipy.special import erf

    v = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        d = 0.5 * (1.0 + erf(v / math.sqrt(2.0))) + v * np.exp(-0.5 * v * v) / math.sqrt(
            2 * math.pi)
    d = np.where(np.abs(v) > 10, (v > 0).astype(np.float64), d)  # x phi(x) -> 0 (and inf*0)
    out = np.asarray(g, dtype=np.float64) * d
    return out.astype(np.result_type(np.asarray(g).dtype, np.asarray(x).dtype))


def dropout_mask(shape, p, seed, dtype=np.float64):
    """1/(1-p) where u >= p else 0, u_i = (splitmix64(seed + (i + 1) gamma) >> 11) 2^-53 for
    element i in C order (``nnkit._random.splitmix64``, plain NumPy)."""
    u = uniform53(splitmix64(seed, np.arange(int(np.prod(shape)))))
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0).astype(dtype).reshape(shape)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance).

    ``x`` (M, D); ``weight``, ``bias`` (D,) or None. Returns y (M, D).
    """
    x = np.asarray(x)
    rows = _rows(x)
    out = np.empty_like(rows)
    d = rows.shape[1]
    for i in range(rows.shape[0]):
        mu = sum(rows[i]) / d
        var = sum((v - mu) ** 2 for v in rows[i]) / d
        out[i] = [(v - mu) / math.sqrt(var + eps) for v in rows[i]]
    if weight is not None:
        out = out * np.asarray(weight, dtype=np.float64)
    if bias is not None:
        out = out + np.asarray(bias, dtype=np.float64)
    return out.reshape(x.shape).astype(x.dtype)


def layer_norm_backward(dy, x, weight=None, eps=1e-5):
    """Gradients of ``layer_norm`` for upstream ``dy`` (M, D): (dx, dweight, dbias).

    With xhat = (x - mu) * rstd and g = dy * weight:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dweight = sum_rows dy * xhat;
    dbias = sum_rows dy. dweight/dbias are None when weight is None.
    """
    x = np.asarray(x)
    rows, dyr = _rows(x), _rows(dy)
    m, d = rows.shape
    w = np.ones(d) if weight is None else np.asarray(weight, dtype=np.float64)
    dx = np.empty_like(rows)
    xhat = np.empty_like(rows)
    for i in range(m):
        mu = sum(rows[i]) / d
        var = sum((v - mu) ** 2 for v in rows[i]) / d
        rstd = 1.0 / math.sqrt(var + eps)
        xhat[i] = [(v - mu) * rstd for v in rows[i]]
        g = [dyr[i, j] * w[j] for j in range(d)]
        mean_g = sum(g) / d
        mean_gx = sum(g[j] * xhat[i, j] for j in range(d)) / d
        dx[i] = [rstd * (g[j] - mean_g - xhat[i, j] * mean_gx) for j in range(d)]
    dweight = dbias = None
    if weight is not None:
        dweight = (dyr * xhat).sum(axis=0).astype(np.asarray(weight).dtype)
        dbias = dyr.sum(axis=0).astype(np.asarray(weight).dtype)
    return dx.reshape(x.shape).astype(x.dtype), dweight, dbias


# Twins of other op families live beside this file, one module per family.
from .reference_attention import (  # noqa: E402
    attention_reference,
    attention_reference_backward,
)
from .reference_conv import (  # noqa: E402
    avg_pool2d,
    avg_pool2d_backward,
    conv1d,
    conv1d_backward,
    conv2d,
    conv2d_backward,
    max_pool2d,
    max_pool2d_backward,
)
from .reference_recurrent import (  # noqa: E402
    gru,
    gru_backward,
    lstm,
    lstm_backward,
    rnn,
    rnn_backward,
)
from .reference_scan import linear_scan, linear_scan_backward  # noqa: E402
