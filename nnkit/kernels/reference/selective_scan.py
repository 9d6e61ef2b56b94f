"""Naive twins of the selective scan (Mamba's S6 recurrence): plain loops over (b, d, t, n).

Computed in float64 and cast back to u's dtype. ``selective_scan`` is mamba_ssm's
``selective_scan_ref`` written one element at a time; ``selective_scan_forward`` /
``selective_scan_backward`` mirror ``nnkit.kernels.selective_scan``'s pair, the backward
being reverse-mode differentiation of the same loops, written out by hand. Layouts:
u, delta, z (batch, dim, L); A (dim, N); B, C (dim, N) time-invariant, (batch, N, L) or
(batch, G, N, L) (channel d reads group d // (dim // G)); D, delta_bias (dim,).
"""

from __future__ import annotations

import math

import numpy as np

from ..._types import Array

__all__ = ["selective_scan", "selective_scan_forward", "selective_scan_backward"]


def _wide(x):
    return None if x is None else np.asarray(x, np.float64)


def _softplus(x):
    """torch's softplus (beta 1, threshold 20)."""
    return x if x > 20.0 else math.log1p(math.exp(x))


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _at(M, b, d, t, n, dim):
    """M's value for batch b, channel d, step t, state n, in any of B's and C's layouts."""
    if M.ndim == 2:  # (dim, N)
        return M[d, n]
    if M.ndim == 3:  # (batch, N, L)
        return M[b, n, t]
    return M[b, d // (dim // M.shape[1]), n, t]  # (batch, G, N, L)


def _steps(delta, delta_bias, delta_softplus, b, d, t):
    """(delta_t after the bias and softplus, its derivative in the raw delta_t)."""
    v = delta[b, d, t] + (0.0 if delta_bias is None else delta_bias[d])
    return (_softplus(v), _sigmoid(v) if v <= 20.0 else 1.0) if delta_softplus else (v, 1.0)


def _states(u, delta, A, B, delta_bias, delta_softplus):
    """x (batch, dim, L + 1, N): x[:, :, 0] = 0, x[:, :, t + 1] the state after step t."""
    batch, dim, L = u.shape
    N = A.shape[1]
    x = np.zeros((batch, dim, L + 1, N))
    for b in range(batch):
        for d in range(dim):
            for t in range(L):
                dt = _steps(delta, delta_bias, delta_softplus, b, d, t)[0]
                for n in range(N):
                    x[b, d, t + 1, n] = (math.exp(dt * A[d, n]) * x[b, d, t, n]
                                         + dt * _at(B, b, d, t, n, dim) * u[b, d, t])
    return x


def selective_scan(u: Array, delta: Array, A: Array, B: Array, C: Array, D: Array | None = None,
                   z: Array | None = None, delta_bias: Array | None = None,
                   delta_softplus: bool = False,
                   return_last_state: bool = False) -> Array | tuple[Array, Array]:
    """x_t = exp(delta_t A) * x_{t-1} + delta_t B_t u_t,  y_t = <C_t, x_t> + D u_t, times
    silu(z_t) when z is given (delta_t = softplus(delta_t + delta_bias) with
    ``delta_softplus``). Returns y (batch, dim, L), and the last state (batch, dim, N) with
    ``return_last_state``."""
    dtype = np.asarray(u).dtype
    u, delta, A, B, C, D, z, delta_bias = map(_wide, (u, delta, A, B, C, D, z, delta_bias))
    batch, dim, L = u.shape
    x = _states(u, delta, A, B, delta_bias, delta_softplus)
    y = np.zeros((batch, dim, L))
    for b in range(batch):
        for d in range(dim):
            for t in range(L):
                v = sum(_at(C, b, d, t, n, dim) * x[b, d, t + 1, n] for n in range(A.shape[1]))
                v += 0.0 if D is None else D[d] * u[b, d, t]
                if z is not None:
                    v *= z[b, d, t] * _sigmoid(z[b, d, t])
                y[b, d, t] = v
    y = y.astype(dtype)
    return (y, x[:, :, L].astype(dtype)) if return_last_state else y


def selective_scan_forward(u: Array, delta: Array, A: Array, B: Array, C: Array,
                           D: Array | None = None, z: Array | None = None,
                           delta_bias: Array | None = None,
                           delta_softplus: bool = False) -> tuple[Array, tuple]:
    """(y, cache): ``selective_scan``'s output, and its arguments as the cache."""
    y = selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return y, (u, delta, A, B, C, D, z, delta_bias, delta_softplus)


def selective_scan_backward(dy: Array, cache: tuple,
                            dlast: Array | None = None) -> tuple[Array | None, ...]:
    """Gradients of a loss with upstream dy = dL/dy (batch, dim, L) and dlast = dL/dx_{L-1}
    (batch, dim, N) (None: zeros), walking t backwards: with g_t = dL/dx_t = dy'_t C_t +
    exp(delta_{t+1} A) g_{t+1} (dy' the gradient before the gate and the skip; g_{L-1}
    starts from dlast), dA += g_t x_{t-1} exp(delta_t A) delta_t, dB_t += g_t delta_t u_t,
    dC_t += dy'_t x_t, ddelta_t += sum_n g_t (x_{t-1} exp(delta_t A) A + B_t u_t).
    Returns (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias), None for inputs that were None."""
    u, delta, A, B, C, D, z, delta_bias, delta_softplus = cache
    dtype = np.asarray(u).dtype
    dy, u, delta, A, B, C, D, z, delta_bias = map(_wide, (dy, u, delta, A, B, C, D, z,
                                                          delta_bias))
    batch, dim, L = u.shape
    N = A.shape[1]
    x = _states(u, delta, A, B, delta_bias, delta_softplus)
    du, ddelta, dA = np.zeros_like(u), np.zeros_like(u), np.zeros_like(A)
    dB, dC = np.zeros_like(B), np.zeros_like(C)
    dD = None if D is None else np.zeros_like(D)
    dz = None if z is None else np.zeros_like(z)
    dbias = None if delta_bias is None else np.zeros_like(delta_bias)

    def add(M, dM, b, d, t, n, value):
        if M.ndim == 2:
            dM[d, n] += value
        elif M.ndim == 3:
            dM[b, n, t] += value
        else:
            dM[b, d // (dim // M.shape[1]), n, t] += value

    for b in range(batch):
        for d in range(dim):
            g = np.zeros(N) if dlast is None else np.array(dlast[b, d], np.float64)
            for t in range(L - 1, -1, -1):
                dt, ddt_dv = _steps(delta, delta_bias, delta_softplus, b, d, t)
                gy = dy[b, d, t]
                if z is not None:
                    zt = z[b, d, t]
                    s = _sigmoid(zt)
                    pre = sum(_at(C, b, d, t, n, dim) * x[b, d, t + 1, n] for n in range(N))
                    pre += 0.0 if D is None else D[d] * u[b, d, t]
                    dz[b, d, t] = gy * pre * s * (1.0 + zt * (1.0 - s))
                    gy = gy * zt * s
                if D is not None:
                    dD[d] += gy * u[b, d, t]
                    du[b, d, t] += gy * D[d]
                gdt = 0.0
                for n in range(N):
                    decay = math.exp(dt * A[d, n])
                    Bn = _at(B, b, d, t, n, dim)
                    add(C, dC, b, d, t, n, gy * x[b, d, t + 1, n])
                    g[n] += gy * _at(C, b, d, t, n, dim)
                    dA[d, n] += g[n] * x[b, d, t, n] * decay * dt
                    add(B, dB, b, d, t, n, g[n] * dt * u[b, d, t])
                    du[b, d, t] += g[n] * dt * Bn
                    gdt += g[n] * (x[b, d, t, n] * decay * A[d, n] + Bn * u[b, d, t])
                    g[n] *= decay
                ddelta[b, d, t] = gdt * ddt_dv
                if dbias is not None:
                    dbias[d] += ddelta[b, d, t]
    return tuple(None if v is None else v.astype(dtype)
                 for v in (du, ddelta, dA, dB, dC, dD, dz, dbias))
