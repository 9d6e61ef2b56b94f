"""GELU, y = x Phi(x) (Phi the standard normal CDF) or its tanh form: a validated
forward/backward pair on NumPy arrays, running the fused Numba kernels of
``nnkit._ext.activation_cpu`` (one pass each way; the naive twins are
``nnkit.kernels.reference.gelu`` and ``gelu_tanh``), and dropout; CuPy arrays run on the
CUDA twins of ``nnkit._ext.activation_cuda`` (one launch each), picked by
``nnkit._backend.kernels_for``. Each forward returns ``(y, cache)``, each backward takes
``(dy, cache, needs=None)`` and returns dx.

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.activation import gelu_backward, gelu_forward
>>> y, cache = gelu_forward(np.array([0.0, 1.0, -20.0]))
>>> [round(float(v), 6) for v in y]
[0.0, 0.841345, 0.0]
>>> gelu_backward(np.ones(3), cache).tolist()
[0.5, 1.0833154705876864, 0.0]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._backend import array_module, backend, kernels_for
from .._types import Array, Needs
from .._validation import (
    FLOATS,
    check_array,
    check_cache,
    check_choice,
    check_grad,
    check_scalar,
)

__all__ = ["GeluCache", "DropoutCache", "gelu_forward", "gelu_backward", "dropout_forward",
           "dropout_backward"]


class GeluCache(NamedTuple):
    """What ``gelu_backward`` reads: the input (the backward recomputes Phi(x) or the tanh
    form's factor from it: one array read instead of two) and which form."""

    x: object
    approximate: str = "none"


class DropoutCache(NamedTuple):
    """What ``dropout_backward`` reads: the mask, 1/(1-p) where kept and 0 where dropped."""

    mask: object


def _kernels(x):
    """``activation_cpu`` for NumPy arrays, ``activation_cuda`` for GPU ones."""
    return kernels_for("activation_cpu", "activation_cuda", x)


def gelu_forward(x: Array, approximate: str = "none") -> tuple[Array, GeluCache]:
    """(y, cache): y = x Phi(x) (approximate 'none') or 0.5 x (1 + tanh(sqrt(2/pi) (x +
    0.044715 x^3))) ('tanh', torch's), shaped and typed like ``x`` (float32/64), one pass;
    the cache keeps x for ``gelu_backward``."""
    x = check_array(x, name="x", dtype=FLOATS)
    check_choice(approximate, name="approximate", choices=("none", "tanh"))
    y = array_module(x).empty_like(x)
    if x.size:
        forward = "gelu_tanh_forward" if approximate == "tanh" else "gelu_forward"
        getattr(_kernels(x), forward)(x.reshape(-1), y.reshape(-1))
    return y, GeluCache(x, approximate)


def gelu_backward(dy: Array, cache: GeluCache, needs: Needs = None) -> Array:
    """dL/dx = dy gelu'(x) from ``gelu_forward``'s cache (exact: Phi(x) + x phi(x)); ``dy``
    of y's shape, dtype and device. ``needs``: ``nnkit.autograd.apply_op``'s mask (the one
    input always needs its gradient)."""
    x, approximate = check_cache(cache, GeluCache, forward="gelu_forward")
    dy = check_grad(dy, shape=x.shape, dtype=x.dtype, device=backend(x))
    dx = array_module(x).empty_like(x)
    if x.size:
        backward = "gelu_tanh_backward" if approximate == "tanh" else "gelu_backward"
        getattr(_kernels(x), backward)(dy.reshape(-1), x.reshape(-1), dx.reshape(-1))
    return dx


def dropout_forward(x: Array, p: float, seed: int) -> tuple[Array, DropoutCache]:
    """(y, cache): y = x * mask with mask = 1/(1-p) where u >= p, else 0, shaped and typed
    like ``x`` (float32/64); the cache keeps the mask. u is element i's (C order) uniform
    draw ``splitmix64(seed + (i + 1) 0x9E3779B97F4A7C15) >> 11`` times 2**-53, the stream of
    ``nnkit._random.uniform`` (twin: ``nnkit.kernels.reference.dropout_mask``).
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
    return y, DropoutCache(mask)


def dropout_backward(dy: Array, cache: DropoutCache, needs: Needs = None) -> Array:
    """dL/dx = dy * mask (one elementwise pass, one kernel on the GPU); ``dy`` of y's shape,
    dtype and device. ``needs`` as in ``gelu_backward``."""
    (mask,) = check_cache(cache, DropoutCache, forward="dropout_forward")
    return check_grad(dy, shape=mask.shape, dtype=mask.dtype, device=backend(mask)) * mask
