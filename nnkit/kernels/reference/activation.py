"""Naive twins of the activation kernels: GELU (exact, erf form) and the dropout mask.

``gelu_forward``/``gelu_backward`` mirror ``nnkit.kernels.activation``'s pair (``(y, cache)``,
``(dy, cache) -> dx``); ``gelu`` gives y alone.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

from ..._random import splitmix64, uniform53
from ..._types import Array

__all__ = ["gelu", "gelu_forward", "gelu_backward", "dropout_mask"]


def gelu(x: Array) -> Array:
    """x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, elementwise in float64 (then x's dtype)."""
    from scipy.special import erf

    v = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        y = v * 0.5 * (1.0 + erf(v / math.sqrt(2.0)))
    y = np.where(np.abs(v) > 10, np.maximum(v, 0), y)  # relu there (and no -inf * 0)
    return y.astype(np.asarray(x).dtype)


def gelu_forward(x: Array) -> tuple[Array, Array]:
    """(y, cache): ``gelu(x)``, and x as the cache."""
    return gelu(x), x


def gelu_backward(dy: Array, cache: Array) -> Array:
    """dy (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), in float64; ``cache``
    the x of ``gelu_forward``."""
    from scipy.special import erf

    x = cache
    v = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        d = 0.5 * (1.0 + erf(v / math.sqrt(2.0))) + v * np.exp(-0.5 * v * v) / math.sqrt(
            2 * math.pi)
    d = np.where(np.abs(v) > 10, (v > 0).astype(np.float64), d)  # x phi(x) -> 0 (and inf*0)
    out = np.asarray(dy, dtype=np.float64) * d
    return out.astype(np.result_type(np.asarray(dy).dtype, np.asarray(x).dtype))


def dropout_mask(shape: int | tuple[int, ...], p: float, seed: int,
                 dtype: DTypeLike = np.float64) -> Array:
    """1/(1-p) where u >= p else 0, u_i = (splitmix64(seed + (i + 1) gamma) >> 11) 2^-53 for
    element i in C order (``nnkit._random.splitmix64``, plain NumPy)."""
    u = uniform53(splitmix64(seed, np.arange(int(np.prod(shape)))))
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0).astype(dtype).reshape(shape)
