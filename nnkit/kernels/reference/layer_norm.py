"""Naive twin of layer normalisation over the last axis (biased variance), in float64."""

from __future__ import annotations

import math

import numpy as np

from .softmax import _rows

__all__ = ["layer_norm", "layer_norm_backward"]


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
