"""Numba kernels for GELU, y = x Phi(x) or its tanh form, forward and backward in one pass
each, and for dropout (mask and masked output in one pass).

Arrays are C-contiguous and flat (the caller reshapes); nothing is validated here
(``nnkit.kernels.activation`` does that). The exact form computes in float64 whatever the
storage dtype; the tanh form in the array's own dtype, branch-free, so that a float32 loop
runs twice the lanes (its float32 error: within 4 ulps of the values' scale,
tests/test_activation.py). Beyond |x| = 10 GELU equals ReLU to float64 rounding (Phi(-10)
~ 8e-24), and the formula is not used there: x * x would overflow for huge inputs and
0 * inf give NaN gradients.

Why a kernel: composed from NumPy and SciPy's ``erf``, GELU forward + backward made ~12
array passes; the fused passes take about half the time, even with libm's ``erf``, which
Numba calls one element at a time (a tenth of a BERT-mini training step:
benchmarks/RESULTS.md, "BERT and ViT"). For float32 arrays Phi comes from a branch-free
formula that LLVM vectorises instead (``_normal_cdf_fast``: the Chebyshev fit of erfc in
Numerical Recipes, fractional error < 1.2e-7, with ``simd_math.fast_exp``; Phi measured
within 1.7e-7 relative of SciPy's ``ndtr`` over [-10, 10], ~3 float32 ulps, and accurate in
the far left tail where 1 + erf(x / sqrt 2) cancels); float64 arrays keep libm. The tanh
form's (1 + tanh u) / 2 is 1 / (1 + exp(-2u)) on ``simd_math``'s exp of that dtype.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from ._dispatch import serial_or_parallel
from .simd_math import expm1_parts32, fast_exp, splitmix64, uniform53

__all__ = ["gelu_forward", "gelu_backward", "gelu_tanh_forward", "gelu_tanh_backward",
           "dropout_forward"]

_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_TANH_C = 0.7978845608028654  # sqrt(2 / pi)


def _normal_cdf_fast(v):
    """Phi(v) = erfc(-v / sqrt 2) / 2, float64, branch-free: erfc(z) = t exp(-z^2 + P(t)),
    t = 1 / (1 + z / 2), for z >= 0 (Numerical Recipes' Chebyshev fit, |error| < 1.2e-7
    relative), and erfc(-z) = 2 - erfc(z)."""
    z = abs(v) * _INV_SQRT2
    t = 1.0 / (1.0 + 0.5 * z)
    p = 0.17087277
    p = -0.82215223 + t * p
    p = 1.48851587 + t * p
    p = -1.13520398 + t * p
    p = 0.27886807 + t * p
    p = -0.18628806 + t * p
    p = 0.09678418 + t * p
    p = 0.37409196 + t * p
    p = 1.00002368 + t * p
    p = -1.26551223 + t * p
    half_erfc = 0.5 * t * fast_exp(p - z * z)
    return 1.0 - half_erfc if v > 0.0 else half_erfc


normal_cdf_fast = numba.njit(cache=True, inline="always",
                             error_model="numpy")(_normal_cdf_fast)


def normal_cdf(v, like):
    """Phi(v) for v float64, in the precision ``like`` (an element of the array) needs."""
    return 0.5 * (1.0 + math.erf(v * _INV_SQRT2))


@overload(normal_cdf, inline="always")
def _normal_cdf(v, like):
    if like == types.float32:
        return lambda v, like: normal_cdf_fast(v)
    return lambda v, like: 0.5 * (1.0 + math.erf(v * _INV_SQRT2))


def gauss(v, like):
    """exp(-v^2 / 2) for v float64: nnkit's vectorisable exp for float32 arrays, libm's
    otherwise."""
    return math.exp(-0.5 * v * v)


@overload(gauss, inline="always")
def _gauss(v, like):
    if like == types.float32:
        return lambda v, like: fast_exp(-0.5 * v * v)
    return lambda v, like: math.exp(-0.5 * v * v)


def _gelu_forward(x, y, cdf):
    """y = x Phi(x) and cdf = Phi(x) (kept for the backward), elementwise over flat arrays."""
    for i in prange(x.size):
        v = float(x[i])
        if abs(v) > 10.0:
            c = 1.0 if v > 0.0 else 0.0
            y[i] = v if v > 0.0 else 0.0
        else:
            c = normal_cdf(v, x[i])
            y[i] = v * c
        cdf[i] = c


def _gelu_backward(g, x, cdf, dx):
    """dx = g (Phi(x) + x phi(x)); g (x > 0) beyond |x| = 10."""
    for i in prange(x.size):
        v = float(x[i])
        if abs(v) > 10.0:
            dx[i] = g[i] if v > 0.0 else 0.0 * g[i]
        else:
            dx[i] = g[i] * (float(cdf[i]) + v * _INV_SQRT_2PI * gauss(v, x[i]))


def exp_like(w):
    """exp(w) in w's own precision (float32 arithmetic for float32 w: twice the lanes)."""
    return math.exp(w)


@overload(exp_like, inline="always")
def _exp_like(w):
    if w == types.float32:
        def exp32(w):
            s, e = expm1_parts32(w)
            return s + e
        return exp32
    return lambda w: fast_exp(w)


def _gelu_tanh_forward(x, k, y):
    """y = x s, s = (1 + tanh u) / 2 = 1 / (1 + exp(-2u)), u = c (x + 0.044715 x^3), in x's
    dtype, branch-free (vectorised); relu's beyond |x| = 10. k: (c, 0.044715, 10, 1, 2, 0)
    in x's dtype (the constants of a float32 loop stay float32)."""
    c, a, big, one, two, zero = k[0], k[1], k[2], k[3], k[4], k[5]
    for i in prange(x.size):
        v = x[i]
        w = min(max(v, -big), big)
        s = one / (one + exp_like(-two * c * (w + a * w * w * w)))
        y[i] = v if v > big else (zero if v < -big else w * s)


def _gelu_tanh_backward(g, x, k, dx):
    """dx = g (s + 2 x s (1 - s) c (1 + 3 0.044715 x^2)) with s (1 - s) = e s^2, e =
    exp(-2u) (no 1 - s to cancel in the right tail); g (x > 0) beyond |x| = 10. k as in
    the forward."""
    c, a, big, one, two, zero = k[0], k[1], k[2], k[3], k[4], k[5]
    for i in prange(x.size):
        v = x[i]
        w = min(max(v, -big), big)
        e = exp_like(-two * c * (w + a * w * w * w))
        s = one / (one + e)
        es = e * s  # = 1 - s, <= 1: multiplied first (e alone reaches 1e38)
        d = s + two * w * (es * s) * c * (one + (one + two) * a * w * w)
        gi = g[i]
        dx[i] = gi if v > big else (zero * gi if v < -big else gi * d)


# error_model="numpy": Python's ZeroDivisionError check on 1 / (1 + z / 2) kept the float32
# loop scalar (several times slower: benchmarks/RESULTS.md, "Figures moved from docstrings").
gelu_forward = serial_or_parallel(_gelu_forward, error_model="numpy")
gelu_backward = serial_or_parallel(_gelu_backward)
gelu_tanh_forward_loop = serial_or_parallel(_gelu_tanh_forward, error_model="numpy")
gelu_tanh_backward_loop = serial_or_parallel(_gelu_tanh_backward, error_model="numpy")


def tanh_constants(dtype):
    """The tanh form's constants in ``dtype`` (see ``_gelu_tanh_forward``)."""
    return np.array([_TANH_C, 0.044715, 10.0, 1.0, 2.0, 0.0], dtype=dtype)


def gelu_tanh_forward(x, y):
    """y = gelu_tanh(x) over flat arrays of one float dtype."""
    gelu_tanh_forward_loop(x, tanh_constants(x.dtype), y)


def gelu_tanh_backward(g, x, dx):
    """dx = g gelu_tanh'(x) over flat arrays of one float dtype."""
    gelu_tanh_backward_loop(g, x, tanh_constants(x.dtype), dx)


# ---- dropout: splitmix64 counters, the same stream as nnkit._random.uniform ---------------
# Element i keeps its value when u_i >= p, u_i = (splitmix64(seed + (i + 1) gamma) >> 11)
# 2^-53 (``simd_math.splitmix64``, ``uniform53``): no generator state, so the pass is
# parallel, and a seed gives the same mask on the CPU as on the GPU. (Drawing with NumPy's
# Generator, building a float mask and multiplying took several times as long:
# benchmarks/RESULTS.md, "BERT and ViT".)


def _dropout_forward(x, seed, p, scale, y, mask):
    """mask[i] = scale if u_i >= p else 0, y[i] = x[i] mask[i], over flat arrays; seed a
    uint64."""
    for i in prange(x.size):
        u = uniform53(splitmix64(seed, i))
        mask[i] = scale if u >= p else 0.0
        y[i] = x[i] * mask[i]  # by the stored mask, as the backward multiplies


dropout_forward = serial_or_parallel(_dropout_forward)
