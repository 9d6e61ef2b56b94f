"""Naive twins of the linear scan: the recurrence as a plain loop, one element at a time.

Computed in float64 / complex128 and cast back to the input's dtype. Re-exported by
``nnkit.kernels.reference``. ``linear_scan_forward``/``linear_scan_backward`` and
``log_linear_scan_forward``/``log_linear_scan_backward`` mirror ``nnkit.kernels.scan``'s
pairs (``(h, cache)``, ``(dh, cache) -> (da, db, dh0)``); ``linear_scan`` and
``log_linear_scan`` give h alone.
"""

from __future__ import annotations

import numpy as np

from ..._types import Array

__all__ = ["linear_scan", "linear_scan_forward", "linear_scan_backward", "log_linear_scan",
           "log_linear_scan_forward", "log_linear_scan_backward"]


def _wide(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _order(T, reverse):
    return range(T - 1, -1, -1) if reverse else range(T)


def linear_scan(a: Array, b: Array, h0: Array | None = None, reverse: bool = False) -> Array:
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


def linear_scan_forward(a: Array, b: Array, h0: Array | None = None, reverse: bool = False,
                        ) -> tuple[Array, tuple[Array, Array, Array | None, bool]]:
    """(h, cache): ``linear_scan(a, b, h0, reverse)``, and (a, h, h0, reverse) as the cache."""
    h = linear_scan(a, b, h0, reverse)
    return h, (a, h, h0, reverse)


def linear_scan_backward(dh: Array, cache: tuple[Array, Array, Array | None, bool],
                         ) -> tuple[Array, Array, Array]:
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


def log_linear_scan(log_a: Array, log_b: Array, log_h0: Array | None = None) -> Array:
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


def log_linear_scan_forward(log_a: Array, log_b: Array, log_h0: Array | None = None,
                            ) -> tuple[Array, tuple[Array, Array, Array, Array | None]]:
    """(log_h, cache): ``log_linear_scan(log_a, log_b, log_h0)``, and (log_a, log_b, log_h,
    log_h0) as the cache."""
    log_h = log_linear_scan(log_a, log_b, log_h0)
    return log_h, (log_a, log_b, log_h, log_h0)


def log_linear_scan_backward(dlog_h: Array, cache: tuple[Array, Array, Array, Array | None],
                             ) -> tuple[Array, Array, Array]:
    """Gradients of ``log_linear_scan`` with upstream dlog_h = dL/dlog_h. log h_t is the log
    of h_t = a_t h_{t-1} + b_t, so its partial derivatives are the two terms' shares of h_t,

        d log h_t / d log a_t = d log h_t / d log h_{t-1} = a_t h_{t-1} / h_t,
        d log h_t / d log b_t = b_t / h_t,

    each exp(its log - log h_t), taken 0 and 1 where h_t = 0 (both terms zero: the
    kernel's convention). Walking back in t, G_t = dlog_h_t + (a_{t+1} h_t / h_{t+1})
    G_{t+1}, dlog_a_t = (a_t h_{t-1} / h_t) G_t, dlog_b_t = (b_t / h_t) G_t, dlog_h0 =
    (a_0 h0 / h_0) G_0. ``cache`` from ``log_linear_scan_forward``. Returns (dlog_a,
    dlog_b, dlog_h0) with the shapes of log_a, log_b (B, T, D) and log_h0 (B, D).
    """
    log_a, log_b, log_h, log_h0 = cache
    dtype = np.asarray(log_a).dtype
    dlog_h, log_a, log_b, log_h = (_wide(x) for x in (dlog_h, log_a, log_b, log_h))
    B, T, D = log_a.shape
    log_h0 = np.full((B, D), -np.inf) if log_h0 is None else _wide(log_h0)
    dlog_a, dlog_b, dlog_h0 = np.zeros_like(log_a), np.zeros_like(log_b), np.zeros((B, D))
    for i in range(B):
        for d in range(D):
            g, carried_next = 0.0, 0.0
            for t in range(T - 1, -1, -1):
                prev = log_h[i, t - 1, d] if t > 0 else log_h0[i, d]
                carried, own = _shares(log_a[i, t, d] + prev, log_b[i, t, d], log_h[i, t, d])
                g = dlog_h[i, t, d] + carried_next * g
                dlog_a[i, t, d] = carried * g
                dlog_b[i, t, d] = own * g
                carried_next = carried
            dlog_h0[i, d] = carried_next * g
    return dlog_a.astype(dtype), dlog_b.astype(dtype), dlog_h0.astype(dtype)


def _shares(log_carried, log_own, log_h):
    """(a h_prev / h, b / h) from their logs; (0, 1) where h = 0."""
    if log_h == -np.inf:
        return 0.0, 1.0
    return float(np.exp(log_carried - log_h)), float(np.exp(log_own - log_h))
