"""Naive twins of the linear scan: the recurrence as a plain loop, one element at a time.

Computed in float64 / complex128 and cast back to the input's dtype. Re-exported by
``nnkit.kernels.reference``. ``linear_scan_forward``/``linear_scan_backward`` mirror
``nnkit.kernels.scan``'s pair (``(h, cache)``, ``(dh, cache) -> (da, db, dh0)``);
``linear_scan`` gives h alone.
"""

from __future__ import annotations

import numpy as np

__all__ = ["linear_scan", "linear_scan_forward", "linear_scan_backward", "log_linear_scan"]


def _wide(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _order(T, reverse):
    return range(T - 1, -1, -1) if reverse else range(T)


def linear_scan(a, b, h0=None, reverse=False):
    """h_t = a_t * h_{t-1} + b_t for t = 0..T-1 (``reverse``: h_t = a_t * h_{t+1} + b_t, t
    from T-1 down), h_{-1} = h0 (zeros when None). a, b (B, T, D), h0 (B, D) -> h (B, T, D)."""
    dtype = np.asarray(a).dtype
    a, b = _wide(a), _wide(b)
    B, T, D = a.shape
    h0 = np.zeros((B, D), a.dtype) if h0 is None else _wide(h0)
    h = np.zeros_like(a)
    for i in range(B):
        for d in range(D):
            state = h0[i, d]
            for t in _order(T, reverse):
                state = a[i, t, d] * state + b[i, t, d]
                h[i, t, d] = state
    return h.astype(dtype)


def linear_scan_forward(a, b, h0=None, reverse=False):
    """(h, cache): ``linear_scan(a, b, h0, reverse)``, and (a, h, h0, reverse) as the cache."""
    h = linear_scan(a, b, h0, reverse)
    return h, (a, h, h0, reverse)


def linear_scan_backward(dh, cache):
    """Gradients of a real loss L with upstream dh = dL/dh (conjugate convention: a complex
    gradient is dL/dRe + i dL/dIm). Walking against the scan's direction,

        g_t = dh_t + conj(a_{t+1}) g_{t+1},  db_t = g_t,  da_t = g_t conj(h_{t-1}),
        dh0 = conj(a_0) g_0        (``reverse``: swap t+1 and t-1, and 0 and T-1).

    ``cache`` from ``linear_scan_forward``. Returns (da, db, dh0) with the shapes of a, b
    (B, T, D) and h0 (B, D).
    """
    a, h, h0, reverse = cache
    dtype = np.asarray(a).dtype
    dh, a, h = _wide(dh), _wide(a), _wide(h)
    B, T, D = a.shape
    h0 = np.zeros((B, D), a.dtype) if h0 is None else _wide(h0)
    da, db, dh0 = np.zeros_like(a), np.zeros_like(a), np.zeros_like(h0)
    forward = list(_order(T, reverse))
    for i in range(B):
        for d in range(D):
            g = 0.0
            for k in range(T - 1, -1, -1):
                t = forward[k]
                g = dh[i, t, d] + (np.conj(a[i, forward[k + 1], d]) * g if k + 1 < T else 0.0)
                prev = h[i, forward[k - 1], d] if k > 0 else h0[i, d]
                db[i, t, d] = g
                da[i, t, d] = g * np.conj(prev)
            if T > 0:
                dh0[i, d] = np.conj(a[i, forward[0], d]) * g
    return da.astype(dtype), db.astype(dtype), dh0.astype(dtype)


def log_linear_scan(log_a, log_b, log_h0=None):
    """log h_t = logaddexp(log a_t + log h_{t-1}, log b_t) for t = 0..T-1, log h_{-1} =
    log_h0 (-inf when None), with NumPy's ``logaddexp`` (NaN in, NaN out). log_a, log_b
    (B, T, D), log_h0 (B, D) -> log_h (B, T, D)."""
    dtype = np.asarray(log_a).dtype
    log_a, log_b = _wide(log_a), _wide(log_b)
    B, T, D = log_a.shape
    log_h0 = np.full((B, D), -np.inf) if log_h0 is None else _wide(log_h0)
    log_h = np.zeros_like(log_a)
    for i in range(B):
        for d in range(D):
            state = log_h0[i, d]
            for t in range(T):
                state = np.logaddexp(log_a[i, t, d] + state, log_b[i, t, d])
                log_h[i, t, d] = state
    return log_h.astype(dtype)
