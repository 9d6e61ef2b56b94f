"""The exact GELU, y = x Phi(x) (Phi the standard normal CDF): a validated forward/backward
pair on NumPy arrays, running the fused Numba kernels of ``nnkit._ext.activation_cpu``
(one pass each way; the naive twin is ``nnkit.kernels.reference.gelu``), and dropout; CuPy
arrays run on the CUDA twins of ``nnkit._ext.activation_cuda`` (one launch each).

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.activation import gelu_forward
>>> y, cdf = gelu_forward(np.array([0.0, 1.0, -20.0]))
>>> [round(float(v), 6) for v in y]
[0.0, 0.841345, 0.0]
"""

from __future__ import annotations

import numpy as np

from .._backend import array_module, kernels_for
from .._validation import FLOATS, check_array, check_same_device, check_same_shape, check_scalar

__all__ = ["gelu_forward", "gelu_backward", "dropout_forward"]


def _kernels(x, *others):
    """``activation_cpu`` for NumPy arrays, ``activation_cuda`` for GPU ones; ``others``
    (name, array) pairs must live where ``x`` does (else TypeError)."""
    for name, array in others:
        check_same_device(array, x, name=name)
    return kernels_for("activation_cpu", "activation_cuda", x)


def gelu_forward(x):
    """(y, cdf): y = x Phi(x) and Phi(x), both shaped and typed like ``x`` (float32/64)."""
    x = check_array(x, name="x", dtype=FLOATS)
    xp = array_module(x)
    y, cdf = xp.empty_like(x), xp.empty_like(x)
    if x.size:
        _kernels(x).gelu_forward(x.reshape(-1), y.reshape(-1), cdf.reshape(-1))
    return y, cdf


def gelu_backward(g, x, cdf):
    """dL/dx = g (Phi(x) + x phi(x)) from ``gelu_forward``'s ``cdf``; shapes of ``x``."""
    x = check_array(x, name="x", dtype=FLOATS)
    g = check_array(g, name="g", dtype=FLOATS)
    cdf = check_array(cdf, name="cdf", dtype=FLOATS)
    check_same_shape(g, x, name_a="g", name_b="x")
    check_same_shape(cdf, x, name_a="cdf", name_b="x")
    kernels = _kernels(x, ("g", g), ("cdf", cdf))
    dx = array_module(x).empty(x.shape, dtype=np.result_type(g.dtype, x.dtype))
    if x.size:
        kernels.gelu_backward(g.reshape(-1), x.reshape(-1), cdf.reshape(-1), dx.reshape(-1))
    return dx


def dropout_forward(x, p: float, seed: int):
    """(y, mask): mask = 1/(1-p) where u >= p, else 0, and y = x * mask, both shaped and
    typed like ``x`` (float32/64). u is element i's (C order) uniform draw
    ``splitmix64(seed + (i + 1) 0x9E3779B97F4A7C15) >> 11`` times 2**-53, the stream of
    ``nnkit._random.device_uniform`` (twin: ``nnkit.kernels.reference.dropout_mask``).
    ``p`` in [0, 1); ``seed`` in [0, 2**64)."""
    x = check_array(x, name="x", dtype=FLOATS)
    check_scalar(p, name="p", low=0.0, high=1.0)
    if p >= 1.0:
        raise ValueError(f"p must be < 1 (p = 1 drops everything: no scale), got {p}")
    if not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    xp = array_module(x)
    y, mask = xp.empty_like(x), xp.empty_like(x)
    if x.size:
        _kernels(x).dropout_forward(x.reshape(-1), np.uint64(seed), float(p), 1.0 / (1.0 - p),
                                    y.reshape(-1), mask.reshape(-1))
    return y, mask
