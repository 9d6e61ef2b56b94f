"""Naive twins of the activation kernels: GELU (exact, erf form, and its tanh
approximation) and the dropout mask.

``gelu_forward``/``gelu_backward`` mirror ``nnkit.kernels.activation``'s pair (``(y, cache)``,
``(dy, cache) -> dx``); ``gelu`` and ``gelu_tanh`` give y alone.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

from ..._random import splitmix64, uniform53
from ..._types import Array

__all__ = ["gelu", "gelu_tanh", "gelu_forward", "gelu_backward", "dropout_mask"]


def gelu(x: Array) -> Array:
    """x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, elementwise in float64 (then x's dtype)."""
    from scipy.special import erf

    v = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        y = v * 0.5 * (1.0 + erf(v / math.sqrt(2.0)))
    y = np.where(np.abs(v) > 10, np.maximum(v, 0), y)  # relu there (and no -inf * 0)
    return y.astype(np.asarray(x).dtype)


_TANH_C = math.sqrt(2.0 / math.pi)  # the tanh form: tanh(c (x + 0.044715 x^3))


def gelu_tanh(x: Array) -> Array:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise in float64 (then x's
    dtype); relu beyond |x| = 10, where the two differ by less than float64 rounding."""
    v = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = 0.5 * v * (1.0 + np.tanh(_TANH_C * (v + 0.044715 * v**3)))
    y = np.where(np.abs(v) > 10, np.maximum(v, 0), y)
    return y.astype(np.asarray(x).dtype)


def gelu_forward(x: Array, approximate: str = "none") -> tuple[Array, tuple[Array, str]]:
    """(y, cache): ``gelu(x)`` (approximate 'none') or ``gelu_tanh(x)`` ('tanh'), and
    (x, approximate) as the cache."""
    return (gelu(x) if approximate == "none" else gelu_tanh(x)), (x, approximate)


def gelu_backward(dy: Array, cache: tuple[Array, str]) -> Array:
    """dy times the derivative, in float64; ``cache`` (x, approximate) of ``gelu_forward``.
    Exact: Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). Tanh form, with
    t = tanh(u), u = c (x + 0.044715 x^3): (1 + t) / 2 + x (1 - t^2) c (1 + 3 0.044715 x^2) / 2.
    Beyond |x| = 10 both are relu's, 1 or 0."""
    from scipy.special import erf

    x, approximate = cache
    v = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "none":
            d = 0.5 * (1.0 + erf(v / math.sqrt(2.0))) + v * np.exp(-0.5 * v * v) / math.sqrt(
                2 * math.pi)
        else:
            t = np.tanh(_TANH_C * (v + 0.044715 * v**3))
            d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * _TANH_C * (1.0 + 3 * 0.044715 * v * v)
    d = np.where(np.abs(v) > 10, (v > 0).astype(np.float64), d)  # relu's (and no inf * 0)
    out = np.asarray(dy, dtype=np.float64) * d
    return out.astype(np.result_type(np.asarray(dy).dtype, np.asarray(x).dtype))


def dropout_mask(shape: int | tuple[int, ...], p: float, seed: int,
                 dtype: DTypeLike = np.float64) -> Array:
    """1/(1-p) where u >= p else 0, u_i = (splitmix64(seed + (i + 1) gamma) >> 11) 2^-53 for
    element i in C order (``nnkit._random.splitmix64``, plain NumPy)."""
    u = uniform53(splitmix64(seed, np.arange(int(np.prod(shape)))))
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0).astype(dtype).reshape(shape)
