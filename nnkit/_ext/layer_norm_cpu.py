"""Layer normalisation over the rows of a C-contiguous (M, D) array: Numba CPU kernels.

Forward, per row i (biased variance, as torch)::

    mean_i = sum_j x_ij / D
    rstd_i = 1 / sqrt(sum_j (x_ij - mean_i)^2 / D + eps)
    y_ij   = (x_ij - mean_i) * rstd_i * weight_j + bias_j

Backward, with xhat = (x - mean) * rstd and g = dy * weight::

    dx_ij     = rstd_i * (g_ij - mean_j g_ij - xhat_ij * mean_j(g_ij * xhat_ij))
    dweight_j = sum_i dy_ij * xhat_ij
    dbias_j   = sum_i dy_ij

Numerics. Every sum runs in float64 whatever the input dtype (two passes over the row, which
is L1-resident, so no Welford is needed); outputs are cast to the output arrays' dtype. The
forward caches ``mean`` and ``rstd`` in x's dtype, so for float32 the cached mean carries a
rounding error that ``(x - mean) * rstd`` would amplify by ``rstd * |mean|``. The backward
therefore treats the cached mean as a shift ``c`` and corrects it in the same pass that forms
the row sums: with u = x - c, the exact mean is c + mean(u), and mean(g * xhat) =
rstd * (mean(g u) - mean(u) mean(g)). This costs nothing extra (the row is read anyway).

Huge rows. In float64 the squares of |x| > ~1.3e154 overflow; such a row (its sum of squares
not finite) has its mean and rstd recomputed in units of a power of two near max|x|
(``rescaled_moments``), so y is the normalised row, not zeros. The backward is right while
x - mean and the row sums of g (x - mean) stay finite (|x| up to ~1e300 for modest D).

Parameter gradients. dweight and dbias are sums over rows. Rows are split into
``n_chunks = min(M, MAX_CHUNKS)`` contiguous blocks (a number that depends on M only, never
on the thread count); ``prange`` runs over the blocks, each adding its rows into its own row
of a float64 workspace ``(n_chunks, D)``, and a second kernel sums the workspace over the
blocks in order. The result is therefore bit-for-bit reproducible for any thread count.

``fastmath={"reassoc"}`` only: it lets LLVM vectorise the row reductions (several times
faster: benchmarks/RESULTS.md, "Figures moved from code comments"; without reassociation a
reduction is one scalar chain). It sets no ``nnan``/``ninf`` flags, so NaN
and infinity still propagate. The compiled kernels differ from the plain functions (the
debugging path, run under ``prange = range``) only in summation order: within a few float64
ulps of the row sums, far below the output dtype's resolution for well-conditioned rows.

Kernels validate nothing: C-contiguous (M, D) arrays with D >= 1, ``weight``/``bias`` (D,)
(pass ones/zeros when the layer has none), preallocated outputs. ``nnkit.kernels.layer_norm``
is the validated entry point.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._dispatch import serial_or_parallel
from .launchers import launchers

__all__ = [*launchers("layer_norm_cpu", "layer_norm_cuda"), "MAX_CHUNKS",
           "layer_norm_backward_chunks", "sum_chunks", "n_chunks_for"]

MAX_CHUNKS = 64
_FASTMATH = {"reassoc"}
_DBL_MAX = float(np.finfo(np.float64).max)


def _rescaled_moments(xr, eps):
    """(mean, 1 / sqrt(var + eps)) of the row ``xr`` (D,) computed in units of c, the power
    of two in (max|x| / 2, max|x|], about the first entry: with z_j = x_j / c - x_0 / c
    (|z_j| < 4, z = 0 exactly for a constant row), mean = x_0 + c mean(z) and
    std = c sqrt(var(z)). Where std^2 overflows, eps is below its rounding and
    rstd = 1 / std. NaN and inf in the row give NaN."""
    D = xr.shape[0]
    m = 0.0
    for j in range(D):
        a = abs(float(xr[j]))
        if a > m:  # NaN skipped: it propagates through z below
            m = a
    if not m <= _DBL_MAX:  # inf in the row
        return math.nan, math.nan
    c = math.ldexp(1.0, math.frexp(m)[1] - 1) if m > 0.0 else 1.0
    inv = 1.0 / c  # exact: c is a power of two
    z0 = float(xr[0]) * inv
    sz = 0.0
    for j in range(D):
        sz += float(xr[j]) * inv - z0
    mz = sz / D
    sv = 0.0
    for j in range(D):
        u = float(xr[j]) * inv - z0 - mz
        sv += u * u
    sd = c * math.sqrt(sv / D)  # the standard deviation, <= max|x|
    var = sd * sd
    r = 1.0 / math.sqrt(var + eps) if var <= _DBL_MAX else 1.0 / sd
    return float(xr[0]) + c * mz, r


# No fastmath: reassociating c sqrt(v) squared into c^2 v overflows (a rare path, not a hot one).
rescaled_moments = numba.njit(cache=True)(_rescaled_moments)


def _layer_norm_rows(x, weight, bias, eps, y, mean, rstd):
    """y = (x - mean) * rstd * weight + bias per row; x, y (M, D), mean, rstd (M,)."""
    M, D = x.shape
    for i in numba.prange(M):
        s = 0.0
        for j in range(D):
            s += float(x[i, j])
        mu = s / D
        ss = 0.0
        for j in range(D):
            u = float(x[i, j]) - mu
            ss += u * u
        if ss <= _DBL_MAX:
            r = 1.0 / math.sqrt(ss / D + eps)
        else:  # the squares overflowed (|x| > ~1e154 in float64), or x holds inf/NaN
            mu, r = rescaled_moments(x[i], eps)
        for j in range(D):
            y[i, j] = (float(x[i, j]) - mu) * r * float(weight[j]) + float(bias[j])
        mean[i] = mu
        rstd[i] = r


def _layer_norm_backward_chunks(dy, x, mean, rstd, weight, dx, dweight_ws, dbias_ws,
                                n_chunks, param_grads):
    """dx per row; with ``param_grads``, per-block partial dweight/dbias into (n_chunks, D).

    Rows [c * step, min(M, (c + 1) * step)) belong to block c, step = ceil(M / n_chunks).
    """
    M, D = x.shape
    step = (M + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        if param_grads:
            for j in range(D):
                dweight_ws[c, j] = 0.0
                dbias_ws[c, j] = 0.0
        for i in range(c * step, min(M, (c + 1) * step)):
            shift = float(mean[i])
            r = float(rstd[i])
            su = 0.0  # sum u, u = x - shift
            sg = 0.0  # sum g, g = dy * weight
            sgu = 0.0  # sum g * u
            for j in range(D):
                u = float(x[i, j]) - shift
                g = float(dy[i, j]) * float(weight[j])
                su += u
                sg += g
                sgu += g * u
            d = su / D  # exact mean = shift + d
            mean_g = sg / D
            # divided by 1 / r, not multiplied by r: reassoc folded r * this with the r of
            # xhat below into r * r, which underflows for std > ~1e154 (dx lost its last term)
            mean_gxhat = (sgu / D - d * mean_g) / (1.0 / r)
            if param_grads:
                for j in range(D):
                    xhat = (float(x[i, j]) - shift - d) * r
                    dyv = float(dy[i, j])
                    dx[i, j] = r * (dyv * float(weight[j]) - mean_g - xhat * mean_gxhat)
                    dweight_ws[c, j] += dyv * xhat
                    dbias_ws[c, j] += dyv
            else:
                for j in range(D):
                    xhat = (float(x[i, j]) - shift - d) * r
                    dx[i, j] = r * (float(dy[i, j]) * float(weight[j]) - mean_g
                                    - xhat * mean_gxhat)


def _sum_chunks(ws, out):
    """out_j = sum_c ws[c, j], blocks added in order c = 0, 1, ...; ws (n_chunks, D)."""
    n, D = ws.shape
    for j in numba.prange(D):
        s = 0.0
        for c in range(n):
            s += ws[c, j]
        out[j] = s


layer_norm_rows = serial_or_parallel(_layer_norm_rows, fastmath=_FASTMATH)
# error_model="numpy": rstd = 0 (a caller's cache) makes 1 / r inf, as before, not an error
layer_norm_backward_chunks = serial_or_parallel(_layer_norm_backward_chunks, fastmath=_FASTMATH,
                                                error_model="numpy")
# No fastmath here: the order of the block sums is the determinism guarantee.
sum_chunks = serial_or_parallel(_sum_chunks)


def n_chunks_for(M: int) -> int:
    """Number of row blocks for the parameter-gradient reduction: depends on M only."""
    return max(1, min(M, MAX_CHUNKS))


def layer_norm_backward_rows(dy, x, mean, rstd, weight, dx, dweight=None, dbias=None):
    """Host launcher: dx into ``dx`` (M, D); dweight, dbias (D,) when given (else skipped).

    Allocates the float64 (n_chunks, D) workspaces for the parameter gradients; both
    ``dweight`` and ``dbias`` are computed when either is requested.
    """
    M, D = x.shape
    n_chunks = n_chunks_for(M)
    param_grads = dweight is not None or dbias is not None
    width = D if param_grads else 0
    dweight_ws = np.empty((n_chunks, width), dtype=np.float64)
    dbias_ws = np.empty((n_chunks, width), dtype=np.float64)
    layer_norm_backward_chunks(dy, x, mean, rstd, weight, dx, dweight_ws, dbias_ws,
                               n_chunks, param_grads)
    if dweight is not None:
        sum_chunks(dweight_ws, dweight)
    if dbias is not None:
        sum_chunks(dbias_ws, dbias)
