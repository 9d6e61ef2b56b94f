"""Naive twins of the activation kernels: GELU (exact, erf form) and the dropout mask."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["gelu", "gelu_backward", "dropout_mask"]


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
    element i in C order, in Python integers (exact 64-bit arithmetic, one element at a
    time)."""
    mask64 = (1 << 64) - 1
    n = int(np.prod(shape))
    out = np.empty(n, dtype=dtype)
    for i in range(n):
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & mask64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask64
        z ^= z >> 31
        out[i] = 1.0 / (1.0 - p) if (z >> 11) * 2.0**-53 >= p else 0.0
    return out.reshape(shape)
