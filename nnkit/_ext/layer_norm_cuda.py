"""Layer normalisation over the rows of a C-contiguous (M, D) array: Numba CUDA kernels.

The same mathematics, numerics and launcher signatures as ``nnkit._ext.layer_norm_cpu``
(read its docstring): float64 accumulators, two passes over the row for mean and variance
(rescaled where the squares overflow), and the backward corrects the cached mean (stored in
x's dtype) in float64.

- forward and the dx part of the backward: one thread block per row, threads striding over
  the row, shared-memory tree reductions (``softmax_cuda._block_sum``);
- dweight/dbias: the rows are cut into ``n_chunks = min(M, MAX_CHUNKS)`` blocks (depends on M
  only); a 2-D grid (column tiles x row blocks) has each thread add its block's rows of one
  column, in order, into a float64 workspace (n_chunks, D); a second kernel sums the
  workspaces (both in one launch) over the blocks in order. No atomics, so the result is
  bit-for-bit reproducible.

Launchers take CuPy arrays, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``; they allocate their float64 workspaces where the input lives
(``_launch.device_empty``) and launch through ``_launch.launch`` (CuPy's current stream).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64

from ._launch import device_empty, launch
from .launchers import launchers
from .layer_norm_cpu import n_chunks_for
from .softmax_cuda import MAX_THREADS, _block_max, _block_sum, threads_for

__all__ = [*launchers("layer_norm_cpu", "layer_norm_cuda")]

col_threads = 128  # columns per block of the dweight/dbias kernels (the tests lower it)
_DBL_MAX = float(np.finfo(np.float64).max)


@cuda.jit(device=True)
def _rescaled_moments(x, i, eps, buf, tid):
    """(mean, rstd) of row i whose squares overflowed, as ``layer_norm_cpu``'s
    ``rescaled_moments``: in units of c, the power of two in (max|x| / 2, max|x|], about the
    row's first entry; NaN when the row holds inf. Every thread of the block calls it."""
    step = cuda.blockDim.x
    D = x.shape[1]
    m = 0.0
    for j in range(tid, D, step):
        a = abs(float64(x[i, j]))
        if a > m:  # NaN skipped: it propagates through z below
            m = a
    m = _block_max(buf, tid, m)
    if not m <= _DBL_MAX:  # inf in the row
        return math.nan, math.nan
    c = math.ldexp(1.0, math.frexp(m)[1] - 1) if m > 0.0 else 1.0
    inv = 1.0 / c  # exact: c is a power of two
    z0 = float64(x[i, 0]) * inv
    sz = 0.0
    for j in range(tid, D, step):
        sz += float64(x[i, j]) * inv - z0
    mz = _block_sum(buf, tid, sz) / D
    sv = 0.0
    for j in range(tid, D, step):
        u = float64(x[i, j]) * inv - z0 - mz
        sv += u * u
    sd = c * math.sqrt(_block_sum(buf, tid, sv) / D)  # the standard deviation, <= max|x|
    var = sd * sd
    r = 1.0 / math.sqrt(var + eps) if var <= _DBL_MAX else 1.0 / sd
    return float64(x[i, 0]) + c * mz, r


@cuda.jit
def _layer_norm_kernel(x, weight, bias, eps, y, mean, rstd):
    buf = cuda.shared.array(MAX_THREADS, float64)
    i = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    D = x.shape[1]
    s = 0.0
    for j in range(tid, D, step):
        s += float64(x[i, j])
    mu = _block_sum(buf, tid, s) / D
    ss = 0.0
    for j in range(tid, D, step):
        u = float64(x[i, j]) - mu
        ss += u * u
    ss = _block_sum(buf, tid, ss)  # the same in every thread: the branch is uniform
    if ss <= _DBL_MAX:
        r = 1.0 / math.sqrt(ss / D + eps)
    else:  # the squares overflowed (|x| > ~1e154 in float64), or x holds inf/NaN
        mu, r = _rescaled_moments(x, i, eps, buf, tid)
    for j in range(tid, D, step):
        y[i, j] = (float64(x[i, j]) - mu) * r * float64(weight[j]) + float64(bias[j])
    if tid == 0:
        mean[i] = mu
        rstd[i] = r


@cuda.jit
def _layer_norm_dx_kernel(dy, x, mean, rstd, weight, dx, mean64):
    buf = cuda.shared.array(MAX_THREADS, float64)
    i = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    D = x.shape[1]
    shift = float64(mean[i])
    r = float64(rstd[i])
    su = 0.0
    sg = 0.0
    sgu = 0.0
    for j in range(tid, D, step):
        u = float64(x[i, j]) - shift
        g = float64(dy[i, j]) * float64(weight[j])
        su += u
        sg += g
        sgu += g * u
    d = _block_sum(buf, tid, su) / D  # exact mean = shift + d
    mean_g = _block_sum(buf, tid, sg) / D
    mean_gxhat = r * (_block_sum(buf, tid, sgu) / D - d * mean_g)
    for j in range(tid, D, step):
        xhat = (float64(x[i, j]) - shift - d) * r
        dx[i, j] = r * (float64(dy[i, j]) * float64(weight[j]) - mean_g - xhat * mean_gxhat)
    if tid == 0:
        mean64[i] = shift + d


@cuda.jit
def _layer_norm_param_chunks_kernel(dy, x, mean64, rstd, dweight_ws, dbias_ws):
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    c = cuda.blockIdx.y
    M, D = x.shape
    n_chunks = cuda.gridDim.y
    rows = (M + n_chunks - 1) // n_chunks
    if j < D:
        sw = 0.0
        sb = 0.0
        for i in range(c * rows, min(M, (c + 1) * rows)):
            dyv = float64(dy[i, j])
            sw += dyv * (float64(x[i, j]) - mean64[i]) * float64(rstd[i])
            sb += dyv
        dweight_ws[c, j] = sw
        dbias_ws[c, j] = sb


@cuda.jit
def _zero_kernel(out):
    j = cuda.grid(1)
    if j < out.shape[0]:
        out[j] = 0.0


@cuda.jit
def _sum_chunks_kernel(ws, out):
    j = cuda.grid(1)
    if j < ws.shape[1]:
        s = 0.0
        for c in range(ws.shape[0]):
            s += ws[c, j]
        out[j] = s


@cuda.jit
def _sum_chunks2_kernel(ws_a, ws_b, out_a, out_b):
    """``_sum_chunks_kernel`` over two workspaces in one launch (dweight and dbias)."""
    j = cuda.grid(1)
    if j < ws_a.shape[1]:
        sa = 0.0
        sb = 0.0
        for c in range(ws_a.shape[0]):
            sa += ws_a[c, j]
            sb += ws_b[c, j]
        out_a[j] = sa
        out_b[j] = sb


def layer_norm_rows(x, weight, bias, eps, y, mean, rstd):
    """y (M, D) = (x - mean) * rstd * weight + bias; mean, rstd (M,). weight, bias (D,)."""
    M, D = x.shape
    if M == 0:
        return
    launch(_layer_norm_kernel, M, threads_for(D), x, weight, bias, float(eps), y, mean, rstd)


def layer_norm_backward_rows(dy, x, mean, rstd, weight, dx, dweight=None, dbias=None):
    """dx into ``dx`` (M, D); dweight, dbias (D,) when given (else skipped)."""
    M, D = x.shape
    param_grads = dweight is not None or dbias is not None
    ct = col_threads
    col_blocks = (D + ct - 1) // ct
    if M == 0:  # empty sums
        for out in (dweight, dbias):
            if out is not None and D > 0:
                launch(_zero_kernel, col_blocks, ct, out)
        return
    mean64 = device_empty(x, M, np.float64)
    launch(_layer_norm_dx_kernel, M, threads_for(D), dy, x, mean, rstd, weight, dx, mean64)
    if not param_grads:
        return
    n_chunks = n_chunks_for(M)
    dweight_ws = device_empty(x, (n_chunks, D), np.float64)
    dbias_ws = device_empty(x, (n_chunks, D), np.float64)
    launch(_layer_norm_param_chunks_kernel, (col_blocks, n_chunks), ct,
           dy, x, mean64, rstd, dweight_ws, dbias_ws)
    if dweight is not None and dbias is not None:  # one launch for both
        launch(_sum_chunks2_kernel, col_blocks, ct, dweight_ws, dbias_ws, dweight, dbias)
    elif dweight is not None:
        launch(_sum_chunks_kernel, col_blocks, ct, dweight_ws, dweight)
    else:
        launch(_sum_chunks_kernel, col_blocks, ct, dbias_ws, dbias)
