"""GELU (exact and tanh form) and dropout on NVIDIA GPUs: one Numba CUDA launch each way, the
twins of ``nnkit._ext.activation_cpu``.

On CuPy arrays GELU was composed from ten CuPy kernels forward and nine backward, dropout
from five (a uniform draw, a comparison, a cast, a division, the product): 107 of the 309
kernels of a digits-ViT training step once the optimizer took one launch per 17 parameters
(benchmarks/RESULTS.md, "Fewer launches per step"). Here:

- ``gelu_forward``: y = x Phi(x); ``gelu_backward``: dx = g (Phi(x) + x phi(x)), Phi
  recomputed from x (nothing kept but x, as on the CPU). float64 arithmetic whatever the
  storage dtype; beyond |x| = 10 GELU is ReLU (the formula is not evaluated there). Phi
  from libdevice's ``erf`` (the CPU's float32 kernel uses a vectorisable fit within 4e-7
  relative of it; float64 agrees to rounding). ``gelu_tanh_forward`` /
  ``gelu_tanh_backward``: the tanh form, y = x s with s = (1 + tanh u) / 2; the backward
  recomputes s from x.
- ``dropout_forward``: mask = 1/(1-p) where u_i >= p else 0, y = x mask (by the stored mask,
  as the backward multiplies), u_i element i's (C order) SplitMix64 draw: the stream of
  ``activation_cpu`` and ``nnkit._random.uniform`` (``simd_math.splitmix64``), so
  a seed gives the same mask on either device.

Arrays are flat and C-contiguous (the caller reshapes), CuPy arrays (NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``); launches go through ``_launch.launch`` on CuPy's current stream.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64

from ._launch import launch
from .launchers import launchers
from .simd_math import splitmix64_dev, uniform53_dev  # SplitMix64: the one dropout stream

__all__ = [*launchers("activation_cpu", "activation_cuda")]

threads = 256  # threads per block
max_blocks = 1024  # blocks per launch; threads stride over the rest (the tests lower both)

_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_TANH_C = 0.7978845608028654  # sqrt(2 / pi)


@cuda.jit
def _gelu_forward_kernel(x, y):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = float64(x[i])
        if abs(v) > 10.0:
            y[i] = v if v > 0.0 else 0.0
        else:
            y[i] = v * 0.5 * (1.0 + math.erf(v * _INV_SQRT2))


@cuda.jit
def _gelu_backward_kernel(g, x, dx):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = float64(x[i])
        gi = float64(g[i])
        if abs(v) > 10.0:
            dx[i] = gi if v > 0.0 else 0.0 * gi
        else:
            cdf = 0.5 * (1.0 + math.erf(v * _INV_SQRT2))
            dx[i] = gi * (cdf + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v))


@cuda.jit(device=True)
def _gelu_tanh_factor(v):
    """(1 + tanh u) / 2 = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (v + 0.044715 v^3)."""
    return 1.0 / (1.0 + math.exp(-2.0 * _TANH_C * (v + 0.044715 * v * v * v)))


@cuda.jit
def _gelu_tanh_forward_kernel(x, y):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = float64(x[i])
        if abs(v) > 10.0:
            y[i] = v if v > 0.0 else 0.0
        else:
            y[i] = v * _gelu_tanh_factor(v)


@cuda.jit
def _gelu_tanh_backward_kernel(g, x, dx):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = float64(x[i])
        gi = float64(g[i])
        if abs(v) > 10.0:
            dx[i] = gi if v > 0.0 else 0.0 * gi
        else:
            si = _gelu_tanh_factor(v)
            dx[i] = gi * (si + 2.0 * v * si * (1.0 - si) * _TANH_C
                          * (1.0 + 3 * 0.044715 * v * v))


@cuda.jit
def _dropout_kernel(x, seed, p, scale, y, mask):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        mask[i] = scale if uniform53_dev(splitmix64_dev(seed, i)) >= p else 0.0
        y[i] = x[i] * mask[i]


def _grid(n):
    return min(max_blocks, (n + threads - 1) // threads), threads


def gelu_forward(x, y):
    """y = x Phi(x) over flat arrays of one float dtype."""
    launch(_gelu_forward_kernel, *_grid(x.shape[0]), x, y)


def gelu_backward(g, x, dx):
    """dx = g (Phi(x) + x phi(x)) over flat arrays, Phi recomputed from x."""
    launch(_gelu_backward_kernel, *_grid(x.shape[0]), g, x, dx)


def gelu_tanh_forward(x, y):
    """y = x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2 over flat arrays."""
    launch(_gelu_tanh_forward_kernel, *_grid(x.shape[0]), x, y)


def gelu_tanh_backward(g, x, dx):
    """dx = g d/dx of the tanh form over flat arrays (recomputed from x)."""
    launch(_gelu_tanh_backward_kernel, *_grid(x.shape[0]), g, x, dx)


def dropout_forward(x, seed, p, scale, y, mask):
    """mask = ``scale`` where u_i >= p else 0 and y = x mask over flat arrays; ``seed`` in
    [0, 2**64)."""
    launch(_dropout_kernel, *_grid(x.shape[0]), x, np.uint64(seed), float(p), float(scale), y,
           mask)
