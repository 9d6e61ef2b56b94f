"""Layer normalisation over the rows of a C-contiguous (M, D) array: Numba CUDA kernels.

The mathematics and launcher signatures of ``nnkit._ext.layer_norm_cpu`` (read its
docstring): two passes over the row for mean and variance (rescaled where the squares
overflow), and the backward corrects the cached mean (stored in x's dtype).

Arithmetic follows the storage dtype (float32 in float32, as torch's kernels accumulate
float32 in float), made accurate where it matters by two choices rather than by float64:

- the forward sums x - x0 (x0 the row's first entry, Sterbenz-exact near the others), so the
  mean's error is relative to the row's spread, not to |mean| (rows at an offset of 100 or
  1e4 keep their digits); the backward likewise sums x - mean (the cached mean);
- every sum (the row sums of mean, variance and the backward's three, the column sums of
  dweight/dbias over the rows) is compensated per thread (``softmax_cuda._kahan_add``), then
  combined by a tree over the block or in order over the chunks: its error stays a few ulps
  whatever D or M.

- forward and the dx part of the backward: one thread block per row, threads striding over
  the row, shared-memory tree reductions (``softmax_cuda._block_sum``);
- dweight/dbias: the rows are cut into ``n_chunks = min(M, MAX_CHUNKS)`` blocks (depends on M
  only); a 2-D grid (column tiles x row blocks) has each thread add its block's rows of one
  column, in order, into a workspace (n_chunks, D) of x's dtype; a second kernel sums the
  workspaces (both in one launch) over the blocks in order. No atomics, so the result is
  bit-for-bit reproducible.

Launchers take CuPy arrays, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``; they allocate their workspaces where the input lives
(``_launch.device_empty``) and launch through ``_launch.launch`` (CuPy's current stream).
"""

from __future__ import annotations

import math

from numba import cuda

from ._launch import device_empty, launch
from .launchers import launchers
from .layer_norm_cpu import n_chunks_for
from .softmax_cuda import MAX_THREADS, _block_max, _block_sum, _kahan_add, threads_for

__all__ = [*launchers("layer_norm_cpu", "layer_norm_cuda")]

col_threads = 128  # columns per block of the dweight/dbias kernels (the tests lower it)


@cuda.jit(device=True)
def _rescaled_moments(x, i, eps, buf, tid):
    """(mean, rstd) of row i whose squares overflowed, as ``layer_norm_cpu``'s
    ``rescaled_moments``: in units of c, the power of two in (max|x| / 2, max|x|], about the
    row's first entry; NaN when the row holds inf. Every thread of the block calls it."""
    step = cuda.blockDim.x
    D = x.shape[1]
    dt = x.dtype.type
    zero = dt(0)
    one = dt(1)
    inf = dt(math.inf)
    m = zero
    for j in range(tid, D, step):
        a = abs(x[i, j])
        if a > m:  # NaN skipped: it propagates through z below
            m = a
    m = _block_max(buf, tid, m)
    if not m < inf:  # inf in the row
        nan = dt(math.nan)
        return nan, nan
    c = math.ldexp(one, math.frexp(m)[1] - 1) if m > zero else one
    inv = one / c  # exact: c is a power of two
    z0 = x[i, 0] * inv
    sz = zero
    cz = zero
    for j in range(tid, D, step):
        sz, cz = _kahan_add(sz, cz, x[i, j] * inv - z0, zero)
    mz = _block_sum(buf, tid, sz - cz) / dt(D)
    sv = zero
    cv = zero
    for j in range(tid, D, step):
        u = x[i, j] * inv - z0 - mz
        sv, cv = _kahan_add(sv, cv, u * u, zero)
    sd = c * math.sqrt(_block_sum(buf, tid, sv - cv) / dt(D))  # the standard deviation
    var = sd * sd
    r = one / math.sqrt(var + eps) if var < inf else one / sd
    return x[i, 0] + c * mz, r


@cuda.jit
def _layer_norm_kernel(x, weight, bias, eps, y, mean, rstd):
    """eps in x's dtype (the launcher converts it)."""
    buf = cuda.shared.array(MAX_THREADS, x.dtype)
    i = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    D = x.shape[1]
    dt = x.dtype.type
    zero = dt(0)
    x0 = x[i, 0]  # the shift: sums of x - x0 err relative to the spread, not to |mean|
    s = zero
    c = zero
    for j in range(tid, D, step):
        s, c = _kahan_add(s, c, x[i, j] - x0, zero)
    d = _block_sum(buf, tid, s - c) / dt(D)  # mean = x0 + d
    ss = zero
    c = zero
    for j in range(tid, D, step):
        u = (x[i, j] - x0) - d
        ss, c = _kahan_add(ss, c, u * u, zero)
    ss = _block_sum(buf, tid, ss - c)  # the same in every thread: the branch is uniform
    if ss < dt(math.inf):
        r = dt(1) / math.sqrt(ss / dt(D) + eps)
        for j in range(tid, D, step):
            y[i, j] = ((x[i, j] - x0) - d) * r * weight[j] + bias[j]
        mu = x0 + d
    else:  # the squares overflowed (|x| > ~1e19 in float32, ~1e154 in float64), or inf/NaN
        mu, r = _rescaled_moments(x, i, eps, buf, tid)
        for j in range(tid, D, step):
            y[i, j] = (x[i, j] - mu) * r * weight[j] + bias[j]
    if tid == 0:
        mean[i] = mu
        rstd[i] = r


@cuda.jit
def _layer_norm_dx_kernel(dy, x, mean, rstd, weight, dx, dmean):
    """dx of row i; dmean[i] = the exact mean of the row minus the cached mean[i] (which is
    rounded to x's dtype), for the dweight kernel."""
    buf = cuda.shared.array(MAX_THREADS, x.dtype)
    i = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    D = x.shape[1]
    dt = x.dtype.type
    zero = dt(0)
    shift = mean[i]
    r = rstd[i]
    su = zero
    cu = zero
    sg = zero
    cg = zero
    sgu = zero
    cgu = zero
    for j in range(tid, D, step):
        u = x[i, j] - shift
        g = dy[i, j] * weight[j]
        su, cu = _kahan_add(su, cu, u, zero)
        sg, cg = _kahan_add(sg, cg, g, zero)
        sgu, cgu = _kahan_add(sgu, cgu, g * u, zero)
    Df = dt(D)
    d = _block_sum(buf, tid, su - cu) / Df  # exact mean = shift + d
    mean_g = _block_sum(buf, tid, sg - cg) / Df
    mean_gxhat = r * (_block_sum(buf, tid, sgu - cgu) / Df - d * mean_g)
    for j in range(tid, D, step):
        xhat = ((x[i, j] - shift) - d) * r
        dx[i, j] = r * (dy[i, j] * weight[j] - mean_g - xhat * mean_gxhat)
    if tid == 0:
        dmean[i] = d


@cuda.jit
def _layer_norm_param_chunks_kernel(dy, x, mean, dmean, rstd, dweight_ws, dbias_ws):
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    c = cuda.blockIdx.y
    M, D = x.shape
    n_chunks = cuda.gridDim.y
    rows = (M + n_chunks - 1) // n_chunks
    zero = dweight_ws.dtype.type(0)
    if j < D:
        sw = zero
        cw = zero
        sb = zero
        cb = zero
        for i in range(c * rows, min(M, (c + 1) * rows)):
            dyv = dy[i, j]
            xhat = ((x[i, j] - mean[i]) - dmean[i]) * rstd[i]
            sw, cw = _kahan_add(sw, cw, dyv * xhat, zero)
            sb, cb = _kahan_add(sb, cb, dyv, zero)
        dweight_ws[c, j] = sw - cw
        dbias_ws[c, j] = sb - cb


@cuda.jit
def _zero_kernel(out):
    j = cuda.grid(1)
    if j < out.shape[0]:
        out[j] = out.dtype.type(0)


@cuda.jit
def _sum_chunks_kernel(ws, out):
    j = cuda.grid(1)
    if j < ws.shape[1]:
        zero = ws.dtype.type(0)
        s = zero
        c = zero
        for k in range(ws.shape[0]):
            s, c = _kahan_add(s, c, ws[k, j], zero)
        out[j] = s - c


@cuda.jit
def _sum_chunks2_kernel(ws_a, ws_b, out_a, out_b):
    """``_sum_chunks_kernel`` over two workspaces in one launch (dweight and dbias)."""
    j = cuda.grid(1)
    if j < ws_a.shape[1]:
        zero = ws_a.dtype.type(0)
        sa = zero
        ca = zero
        sb = zero
        cb = zero
        for k in range(ws_a.shape[0]):
            sa, ca = _kahan_add(sa, ca, ws_a[k, j], zero)
            sb, cb = _kahan_add(sb, cb, ws_b[k, j], zero)
        out_a[j] = sa - ca
        out_b[j] = sb - cb


def layer_norm_rows(x, weight, bias, eps, y, mean, rstd):
    """y (M, D) = (x - mean) * rstd * weight + bias; mean, rstd (M,). weight, bias (D,)."""
    M, D = x.shape
    if M == 0:
        return
    launch(_layer_norm_kernel, M, threads_for(D), x, weight, bias, x.dtype.type(eps), y, mean,
           rstd)


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
    dmean = device_empty(x, M, x.dtype)  # the exact row mean minus the cached mean
    launch(_layer_norm_dx_kernel, M, threads_for(D), dy, x, mean, rstd, weight, dx, dmean)
    if not param_grads:
        return
    n_chunks = n_chunks_for(M)
    dweight_ws = device_empty(x, (n_chunks, D), x.dtype)
    dbias_ws = device_empty(x, (n_chunks, D), x.dtype)
    launch(_layer_norm_param_chunks_kernel, (col_blocks, n_chunks), ct,
           dy, x, mean, dmean, rstd, dweight_ws, dbias_ws)
    if dweight is not None and dbias is not None:  # one launch for both
        launch(_sum_chunks2_kernel, col_blocks, ct, dweight_ws, dbias_ws, dweight, dbias)
    elif dweight is not None:
        launch(_sum_chunks_kernel, col_blocks, ct, dweight_ws, dweight)
    else:
        launch(_sum_chunks_kernel, col_blocks, ct, dbias_ws, dbias)
