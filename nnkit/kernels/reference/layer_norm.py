"""Naive twin of layer normalisation over the last axis (biased variance), in float64.

``layer_norm_forward``/``layer_norm_backward`` mirror ``nnkit.kernels.layer_norm``'s pair
(``(y, cache)`` and ``(dy, cache) -> (dx, dweight, dbias)``); ``layer_norm`` gives y alone.
"""

from __future__ import annotations

import math

import numpy as np

from ..._types import Array
from .softmax import _rows

__all__ = ["layer_norm", "layer_norm_forward", "layer_norm_backward"]


def layer_norm(x: Array, weight: Array | None = None, bias: Array | None = None,
               eps: float = 1e-5) -> Array:
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


def layer_norm_forward(x: Array, weight: Array | None = None, bias: Array | None = None,
                       eps: float = 1e-5) -> tuple[Array, tuple[Array, Array | None, bool, float]]:
    """(y, cache): ``layer_norm(x, weight, bias, eps)``, and (x, weight, whether there is a
    bias, eps) as the cache."""
    return layer_norm(x, weight, bias, eps), (x, weight, bias is not None, eps)


def layer_norm_backward(dy: Array, cache: tuple[Array, Array | None, bool, float],
                        ) -> tuple[Array, Array | None, Array | None]:
    """Gradients of ``layer_norm`` for upstream ``dy`` (M, D): (dx, dweight, dbias), with
    ``cache`` from ``layer_norm_forward`` (the statistics are recomputed from x).

    With xhat = (x - mu) * rstd and g = dy * weight:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dweight = sum_rows dy * xhat;
    dbias = sum_rows dy. dweight (dbias) is None when the forward had no weight (bias).
    """
    x, weight, has_bias, eps = cache
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
    dweight = None if weight is None else (dyr * xhat).sum(axis=0).astype(x.dtype)
    dbias = dyr.sum(axis=0).astype(x.dtype) if has_bias else None
    return dx.reshape(x.shape).astype(x.dtype), dweight, dbias
