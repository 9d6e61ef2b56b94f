"""Numba kernels for GELU, y = x Phi(x) or its tanh form, forward and backward in one pass
each, and for dropout (mask and masked output in one pass).

Arrays are C-contiguous and flat (the caller reshapes); nothing is validated here
(``nnkit.kernels.activation`` does that). Both GELU forms compute in the array's own dtype,
branch-free, so that a float32 loop vectorises at twice the lanes of a float64 one; the
backward recomputes its factor from x (nothing is cached but x). Beyond |x| = 10 GELU
equals ReLU to float64 rounding (Phi(-10) ~ 8e-24), and the formula is not used there:
x * x would overflow for huge inputs and 0 * inf give NaN gradients.

The exact form's Phi. Numba calls libm's ``erf`` one element at a time, so float32 arrays
take a vectorisable formula instead: Phi(-a) = exp(-a^2 / 2) t R(t - 1/2), t = 1 / (1 +
a/2), R a degree-9 polynomial (``_PHI_FIT``), with a^2 split exactly into hi + lo and
``simd_math``'s float32 exp, and Phi(a) = 1 - Phi(-a). It keeps its relative accuracy in
the far left tail, where 1 + erf(x / sqrt 2) cancels: within 4e-7 relative of SciPy's
``ndtr`` over [-10, 10] (tests/test_activation.py). Float64 arrays keep libm's erf and exp.
The tanh form's (1 + tanh u) / 2 is 1 / (1 + exp(-2u)) on ``simd_math``'s exp of that
dtype (float32 results within 4 ulps of their scale).

Why kernels: composed from NumPy and SciPy's ``erf``, GELU forward + backward made ~12
array passes (a tenth of a BERT-mini training step: benchmarks/RESULTS.md, "BERT and ViT").
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from ._dispatch import serial_or_parallel
from .launchers import launchers
from .simd_math import (
    exp_normal32,
    expm1_parts32,
    fast_exp,
    mul_error,
    splitmix64,
    uniform53,
)

__all__ = [*launchers("activation_cpu", "activation_cuda")]

_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_TANH_C = 0.7978845608028654  # sqrt(2 / pi)


# Phi(-a) = exp(-a^2 / 2) t R(t - 1/2), t = 1 / (1 + a/2), for a in [0, 10]: R is the
# degree-9 weighted least-squares Chebyshev fit of Phi(-a) exp(a^2 / 2) / t in powers of
# t - 1/2 (relative error 7.8e-8; tests/test_activation.py refits it), as float32.
_PHI_FIT = tuple(np.float32(c) for c in (
    0.33620399236679077, 0.33140435814857483, 0.057596731930971146, -0.14686372876167297,
    -0.0038673868402838707, 0.10735747218132019, -0.06012163311243057, -0.04922608286142349,
    0.08512619882822037, -0.03538287431001663))
_F = np.float32


def _left_tail32(a):
    """(Phi(-a), exp(-a^2 / 2)) for float32 a in [0, 10], in float32 arithmetic. a^2 is
    hi + lo exactly, so the Gaussian keeps its relative accuracy where a^2 / 2 reaches 50
    (a float32 a^2 alone is off by up to 3e-6 there, and so would be exp of it)."""
    t = _F(1.0) / (_F(1.0) + _F(0.5) * a)
    s = t - _F(0.5)
    r = _PHI_FIT[9]
    r = r * s + _PHI_FIT[8]
    r = r * s + _PHI_FIT[7]
    r = r * s + _PHI_FIT[6]
    r = r * s + _PHI_FIT[5]
    r = r * s + _PHI_FIT[4]
    r = r * s + _PHI_FIT[3]
    r = r * s + _PHI_FIT[2]
    r = r * s + _PHI_FIT[1]
    r = r * s + _PHI_FIT[0]
    hi = a * a
    gauss = exp_normal32(_F(-0.5) * hi) * (_F(1.0) - _F(0.5) * mul_error(a, a, hi))
    return gauss * (r * t), gauss


left_tail32 = numba.njit(cache=True, inline="always", error_model="numpy")(_left_tail32)


def cdf_and_gauss(v):
    """(Phi(v), exp(-v^2 / 2)) in v's precision: float32 arithmetic for float32 v (the fit
    above, branch-free), libm's erf and exp in float64 otherwise."""
    return 0.5 * (1.0 + math.erf(v * _INV_SQRT2)), math.exp(-0.5 * v * v)


@overload(cdf_and_gauss, inline="always")
def _cdf_and_gauss(v):
    if v == types.float32:
        def float32_form(v):
            p, gauss = left_tail32(min(abs(v), _F(10.0)))
            return (_F(1.0) - p if v > _F(0.0) else p), gauss
        return float32_form
    return lambda v: (0.5 * (1.0 + math.erf(v * _INV_SQRT2)), math.exp(-0.5 * v * v))


def _gelu_forward(x, k, y):
    """y = x Phi(x), elementwise over flat arrays, branch-free; relu's beyond |x| = 10.
    k: (10, 0, 1 / sqrt(2 pi)) in x's dtype."""
    big, zero = k[0], k[1]
    for i in prange(x.size):
        v = x[i]
        c, _ = cdf_and_gauss(v)
        y[i] = v if v > big else (zero if v < -big else v * c)


def _gelu_backward(g, x, k, dx):
    """dx = g (Phi(x) + x phi(x)), Phi recomputed from x; g (x > 0) beyond |x| = 10."""
    big, zero, inv_sqrt_2pi = k[0], k[1], k[2]
    for i in prange(x.size):
        v = x[i]
        c, gauss = cdf_and_gauss(v)
        gi = g[i]
        dx[i] = gi if v > big else (zero * gi if v < -big
                                    else gi * (c + v * inv_sqrt_2pi * gauss))


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
# The exact form's multiply-adds are fused (fastmath 'contract' only: NaN and inf propagate).
gelu_forward_loop = serial_or_parallel(_gelu_forward, error_model="numpy",
                                       fastmath={"contract"})
gelu_backward_loop = serial_or_parallel(_gelu_backward, error_model="numpy",
                                        fastmath={"contract"})
gelu_tanh_forward_loop = serial_or_parallel(_gelu_tanh_forward, error_model="numpy")
gelu_tanh_backward_loop = serial_or_parallel(_gelu_tanh_backward, error_model="numpy")


def exact_constants(dtype):
    """The exact form's constants in ``dtype`` (see ``_gelu_forward``)."""
    return np.array([10.0, 0.0, _INV_SQRT_2PI], dtype=dtype)


def gelu_forward(x, y):
    """y = gelu(x) over flat arrays of one float dtype."""
    gelu_forward_loop(x, exact_constants(x.dtype), y)


def gelu_backward(g, x, dx):
    """dx = g gelu'(x) over flat arrays of one float dtype."""
    gelu_backward_loop(g, x, exact_constants(x.dtype), dx)


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
