"""GELU (exact and tanh form) and dropout on NVIDIA GPUs: one Numba CUDA launch each way, the
twins of ``nnkit._ext.activation_cpu``.

On CuPy arrays GELU was composed from ten CuPy kernels forward and nine backward, dropout
from five (a uniform draw, a comparison, a cast, a division, the product): 107 of the 309
kernels of a digits-ViT training step once the optimizer took one launch per 17 parameters
(benchmarks/RESULTS.md, "Fewer launches per step"). Here:

- ``gelu_forward``: y = x Phi(x); ``gelu_backward``: dx = g (Phi(x) + x phi(x)), Phi
  recomputed from x (nothing kept but x, as on the CPU). Beyond |x| = 10 GELU is ReLU (the
  formula is not evaluated there). Phi(x) = erfc(-x / sqrt 2) / 2 from libdevice's ``erfc``:
  no 1 + erf to cancel in the left tail, so Phi keeps its relative accuracy there, as the
  CPU's float32 fit does. ``gelu_tanh_forward`` / ``gelu_tanh_backward``: the tanh form,
  y = x s with s = (1 + tanh u) / 2 = 1 / (1 + e), e = exp(-2u); the backward recomputes s
  from x and takes 1 - s as e s (no cancellation in the right tail), as the CPU does.
- ``dropout_forward``: mask = 1/(1-p) where u_i >= p else 0, y = x mask (by the stored mask,
  as the backward multiplies), u_i element i's (C order) SplitMix64 draw: the stream of
  ``activation_cpu`` and ``nnkit._random.uniform`` (``simd_math.splitmix64``), so
  a seed gives the same mask on either device. u_i = k_i 2**-53 with k_i the draw's top 53
  bits, so u_i >= p is compared as k_i >= ceil(p 2**53), in integers (the same mask).

Arithmetic follows the storage dtype: the constants are made in x's dtype (``x.dtype.type``)
and libdevice's float32 functions serve float32, so a float32 kernel has no float64
instruction (the GPUs of most users run float64 at 1/32-1/64 of the float32 rate).

Arrays are flat and C-contiguous (the caller reshapes), CuPy arrays (NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``); launches go through ``_launch.launch`` on CuPy's current stream.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, uint64

from ._launch import launch
from .launchers import launchers
from .simd_math import splitmix64_dev  # SplitMix64: the one dropout stream

__all__ = [*launchers("activation_cpu", "activation_cuda")]

threads = 256  # threads per block
max_blocks = 1024  # blocks per launch; threads stride over the rest (the tests lower both)

_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_TANH_C = 0.7978845608028654  # sqrt(2 / pi)
_TANH_A = 0.044715


@cuda.jit
def _gelu_forward_kernel(x, y):
    dt = x.dtype.type
    big, zero, half, inv_sqrt2 = dt(10), dt(0), dt(0.5), dt(_INV_SQRT2)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = x[i]
        if abs(v) > big:
            y[i] = v if v > zero else zero
        else:
            y[i] = v * (half * math.erfc(-v * inv_sqrt2))


@cuda.jit
def _gelu_backward_kernel(g, x, dx):
    dt = x.dtype.type
    big, zero, half = dt(10), dt(0), dt(0.5)
    inv_sqrt2, inv_sqrt_2pi = dt(_INV_SQRT2), dt(_INV_SQRT_2PI)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = x[i]
        gi = g[i]
        if abs(v) > big:
            dx[i] = gi if v > zero else zero * gi
        else:
            cdf = half * math.erfc(-v * inv_sqrt2)
            dx[i] = gi * (cdf + v * inv_sqrt_2pi * math.exp(-half * v * v))


@cuda.jit(device=True)
def _gelu_tanh_e(v, c, a, two):
    """e = exp(-2u), u = c (v + a v^3) (c = sqrt(2/pi), a = 0.044715 and two in v's dtype);
    s = 1 / (1 + e). At |v| <= 10, e <= 8.3e37 fits float32."""
    return math.exp(-two * c * (v + a * v * v * v))


@cuda.jit
def _gelu_tanh_forward_kernel(x, y):
    dt = x.dtype.type
    big, zero, one, two = dt(10), dt(0), dt(1), dt(2)
    c, a = dt(_TANH_C), dt(_TANH_A)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = x[i]
        if abs(v) > big:
            y[i] = v if v > zero else zero
        else:
            y[i] = v * (one / (one + _gelu_tanh_e(v, c, a, two)))


@cuda.jit
def _gelu_tanh_backward_kernel(g, x, dx):
    dt = x.dtype.type
    big, zero, one, two, three = dt(10), dt(0), dt(1), dt(2), dt(3)
    c, a = dt(_TANH_C), dt(_TANH_A)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        v = x[i]
        gi = g[i]
        if abs(v) > big:
            dx[i] = gi if v > zero else zero * gi
        else:
            e = _gelu_tanh_e(v, c, a, two)
            si = one / (one + e)
            es = e * si  # = 1 - s, <= 1: multiplied first (e alone reaches 8e37)
            dx[i] = gi * (si + two * v * (es * si) * c * (one + three * a * v * v))


@cuda.jit
def _dropout_kernel(x, seed, threshold, scale, y, mask):
    """mask = scale where the draw's top 53 bits k >= threshold = ceil(p 2**53) (u = k 2**-53
    >= p), else 0; ``scale`` in x's dtype."""
    zero = x.dtype.type(0)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        keep = (splitmix64_dev(seed, i) >> uint64(11)) >= threshold
        mask[i] = scale if keep else zero
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
    threshold = np.uint64(math.ceil(float(p) * 2.0**53))  # exact: p 2**53 is a float64
    launch(_dropout_kernel, *_grid(x.shape[0]), x, np.uint64(seed), threshold,
           x.dtype.type(scale), y, mask)
