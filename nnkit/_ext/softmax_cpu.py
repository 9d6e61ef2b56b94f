"""Numba CPU kernels of the softmax family: row softmax, log-softmax, their backwards and
the fused cross-entropy, over the last axis of 2-D C-contiguous arrays.

Launchers (the same names and signatures as ``nnkit._ext.softmax_cuda``; no validation,
preallocated outputs, rows ``(R, C)``):

- ``softmax_rows(x, out)``
- ``log_softmax_rows(x, out)``
- ``softmax_backward_rows(dy, y, out)``
- ``log_softmax_backward_rows(dy, y, out)``
- ``cross_entropy_rows(logits, target, ignore_index, lse, loss_rows)``
- ``cross_entropy_backward_rows(logits, target, lse, scale, ignore_index, out)``
- ``cross_entropy_mean(loss_rows, target, ignore_index, loss, n_valid)``
- ``cross_entropy_mean_backward_rows(logits, target, lse, dloss, n_valid, ignore_index, out)``
- ``first_invalid_target(target, C, ignore_index)``: the index of the first target outside
  [0, C) (other than ``ignore_index``), or None; the CPU kernels index the logits by the
  targets, so ``nnkit.kernels.softmax`` refuses such a target before they run.

Why this is fast. Numba's ``math.exp`` is a scalar libm call here (llvmlite has no SVML), so
the kernels use ``simd_math.exp_approx`` (Cody-Waite reduction, a polynomial and ``2**n``
from LLVM intrinsics: every loop that calls it is a plain map loop that LLVM vectorises with
AVX-512; float32 and float64 within 2 ulp, full IEEE range; see ``nnkit._ext.simd_math``).
Row maxima use ``simd_math.fmax``, LLVM's NaN-propagating ``llvm.maximum`` (a
compare-and-select max loop does not vectorise); row sums go through small helpers compiled
with ``fastmath={'reassoc'}`` only (see ``_exp_shift_sum``).

Each launcher is a plain Python function (the debugging path: it runs uncompiled with
``NUMBA_DISABLE_JIT=1``) compiled with ``numba.njit(cache=True, parallel=True)``; rows run
in ``prange`` chunks, per-thread scratch is allocated once per chunk.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from ._dispatch import serial_or_parallel
from .launchers import launchers
from .simd_math import exp_approx, fmax

__all__ = [*launchers("softmax_cpu", "softmax_cuda")]

_N_CHUNKS = 64  # prange chunks of rows in cross-entropy (each allocates its scratch once)
_SUM_BLOCK = 1024  # columns per float32 partial sum (then added in float64)
_BLOCK = 4096  # columns of per-thread scratch in cross-entropy (at most 32 KiB: in L1)

# --------------------------------------------------------------------------------------
# Row reductions.


def _cast_like(v, like):
    """``v`` converted to the float type of ``like``."""
    return type(like)(v)


@overload(_cast_like)
def _ov_cast_like(v, like):
    if like == types.float32:
        return lambda v, like: np.float32(v)
    return lambda v, like: np.float64(v)


def _zero_like(v):
    """A zero of ``v``'s float type (keeps float32 accumulators float32)."""
    return type(v)(0)


@overload(_zero_like)
def _ov_zero_like(v):
    if v == types.float32:
        return lambda v: np.float32(0.0)
    return lambda v: 0.0


def _row_max(xr):
    """max of a row (C >= 1); NaN anywhere gives NaN."""
    m = xr[0]
    for j in range(xr.shape[0]):
        m = fmax(m, xr[j])
    return m


def _row_sum(xr):
    """sum of a row in float64 (``fastmath={'reassoc'}``, see ``_exp_shift_sum``)."""
    s = 0.0
    for j in range(xr.shape[0]):
        s += xr[j]
    return s


def _row_dot(a, b):
    """sum_j a_j b_j in float64 (``fastmath={'reassoc'}``, see ``_exp_shift_sum``)."""
    s = 0.0
    for j in range(a.shape[0]):
        s += np.float64(a[j]) * np.float64(b[j])
    return s


def _exp_shift_sum(xr, m, er):
    """er[j] = exp(xr[j] - m); returns sum_j er[j], accumulated in the row's dtype.

    The reductions (this, ``_row_sum``, ``_row_dot``) are compiled with
    ``fastmath={'reassoc'}`` and nothing else: reassociation lets LLVM keep vector partial
    sums (a strictly ordered sum does not vectorise), which changes the result only by
    rounding; NaN and inf still propagate (no ``nnan``/``ninf``). ``exp_approx`` is a separate
    function compiled without ``reassoc``, so its range reduction is evaluated as written.
    Callers pass blocks of ``_SUM_BLOCK`` columns and add the block sums in float64, so a
    float32 partial sum never holds more than a few dozen terms.
    """
    s = _zero_like(m)
    for j in range(xr.shape[0]):
        e = exp_approx(xr[j] - m)
        er[j] = e
        s += e
    return s


_row_max_jit = numba.njit(cache=True)(_row_max)
_row_sum_jit = numba.njit(cache=True, fastmath={"reassoc"})(_row_sum)
_row_dot_jit = numba.njit(cache=True, fastmath={"reassoc"})(_row_dot)
_exp_shift_sum_jit = numba.njit(cache=True, fastmath={"reassoc"})(_exp_shift_sum)


def _exp_shift_sum_blocked(xr, m, er):
    """er = exp(xr - m) over a row; returns the float64 sum of blocks' sums."""
    total = 0.0
    for b in range(0, xr.shape[0], _SUM_BLOCK):  # slices, not min(): keeps it vectorised
        total += _exp_shift_sum_jit(xr[b : b + _SUM_BLOCK], m, er[b : b + _SUM_BLOCK])
    return total


_exp_shift_sum_blocked_jit = numba.njit(cache=True)(_exp_shift_sum_blocked)

# --------------------------------------------------------------------------------------
# Launchers.


def _softmax_rows(x, out):
    """out[i] = exp(x[i] - max x[i]) / sum_j exp(x[i, j] - max x[i]); x, out (R, C)."""
    R, C = x.shape
    if C == 0:
        return
    for i in prange(R):
        xr = x[i]
        yr = out[i]
        m = _row_max_jit(xr)
        inv = 1.0 / _exp_shift_sum_blocked_jit(xr, m, yr)  # yr holds the exponentials
        inv = _cast_like(inv, m)
        for j in range(C):
            yr[j] = yr[j] * inv


def _log_softmax_rows(x, out):
    """out[i] = x[i] - (m_i + log sum_j exp(x[i, j] - m_i)), m_i = max x[i]; x, out (R, C)."""
    R, C = x.shape
    if C == 0:
        return
    for i in prange(R):
        xr = x[i]
        yr = out[i]
        m = _row_max_jit(xr)
        lse = m + math.log(_exp_shift_sum_blocked_jit(xr, m, yr))  # yr: exp scratch
        for j in range(C):
            yr[j] = xr[j] - lse


def _softmax_backward_rows(dy, y, out):
    """out[i] = y[i] * (dy[i] - sum_j dy[i, j] y[i, j]); dy, y, out (R, C)."""
    R, C = y.shape
    if C == 0:
        return
    for i in prange(R):
        yr = y[i]
        dyr = dy[i]
        dxr = out[i]
        dot = _row_dot_jit(dyr, yr)
        for j in range(C):
            dxr[j] = yr[j] * (dyr[j] - dot)


def _log_softmax_backward_rows(dy, y, out):
    """out[i] = dy[i] - exp(y[i]) * sum_j dy[i, j]; dy, y, out (R, C)."""
    R, C = y.shape
    if C == 0:
        return
    for i in prange(R):
        yr = y[i]
        dyr = dy[i]
        dxr = out[i]
        s = _row_sum_jit(dyr)
        for j in range(C):
            dxr[j] = dyr[j] - exp_approx(yr[j]) * s


def _cross_entropy_rows(logits, target, ignore_index, lse, loss_rows):
    """One pass per row: lse[i] = log sum_j exp(logits[i, j]); loss_rows[i] = lse[i] -
    logits[i, target[i]], 0 where target[i] == ignore_index. logits (N, C); target, lse,
    loss_rows (N,) (``nnkit.kernels`` passes float64 lse and loss_rows: a float32 lse of
    logits near 1e4 would lose the gradient's precision). Targets are valid (checked at
    the boundary). No softmax is stored: the exponentials go through a per-thread scratch
    block of ``_BLOCK`` columns."""
    N, C = logits.shape
    if N == 0:
        return
    n_chunks = min(N, _N_CHUNKS)
    for c in prange(n_chunks):
        lo = c * N // n_chunks
        hi = (c + 1) * N // n_chunks
        scratch = np.empty(min(C, _BLOCK), dtype=logits.dtype)
        for i in range(lo, hi):
            xr = logits[i]
            m = _row_max_jit(xr)
            s = 0.0
            for b in range(0, C, _BLOCK):
                w = min(_BLOCK, C - b)
                s += _exp_shift_sum_blocked_jit(xr[b : b + w], m, scratch[:w])
            row_lse = m + math.log(s)
            lse[i] = row_lse
            t = target[i]
            if t == ignore_index:
                loss_rows[i] = 0.0
            else:
                loss_rows[i] = row_lse - xr[t]


def _cross_entropy_backward_rows(logits, target, lse, scale, ignore_index, out):
    """out[i] = (exp(logits[i] - lse[i]) - onehot(target[i])) * scale, zero rows where
    target[i] == ignore_index. logits, out (N, C); target, lse (N,); scale = dloss / n_valid."""
    N, C = logits.shape
    if C == 0:
        return
    for i in prange(N):
        xr = logits[i]
        dxr = out[i]
        t = target[i]
        if t == ignore_index:
            for j in range(C):
                dxr[j] = 0.0
            continue
        # lse (float64) as hi + lo in the row's dtype: z = (x - hi) - lo keeps the precision
        # of a float64 difference (x - hi is exact where x is near lse, where it matters) in
        # row-dtype arithmetic, which vectorises (faster in float32:
        # benchmarks/RESULTS.md, "BERT and ViT")
        hi = _cast_like(lse[i], xr[0])
        lo = _cast_like(lse[i] - hi, xr[0])
        sc = _cast_like(scale, xr[0])
        for j in range(C):
            dxr[j] = exp_approx((xr[j] - hi) - lo) * sc
        dxr[t] = (exp_approx((xr[t] - hi) - lo) - 1) * sc


softmax_rows = serial_or_parallel(_softmax_rows)
log_softmax_rows = serial_or_parallel(_log_softmax_rows)
softmax_backward_rows = serial_or_parallel(_softmax_backward_rows)
log_softmax_backward_rows = serial_or_parallel(_log_softmax_backward_rows)
cross_entropy_rows = serial_or_parallel(_cross_entropy_rows)
cross_entropy_backward_rows = serial_or_parallel(_cross_entropy_backward_rows)


def cross_entropy_mean(loss_rows, target, ignore_index, loss, n_valid):
    """The mean over the valid rows: n_valid (1,) float64 = the rows whose target is not
    ``ignore_index``, loss (1,) (the logits' dtype) = sum(loss_rows) / n_valid (NaN when
    none is valid); loss_rows (N,) float64 from ``cross_entropy_rows``."""
    count = int(np.count_nonzero(target != ignore_index))
    total = float(loss_rows.sum(dtype=np.float64)) if loss_rows.shape[0] else 0.0
    n_valid[0] = count
    loss[0] = total / count if count else math.nan


def cross_entropy_mean_backward_rows(logits, target, lse, dloss, n_valid, ignore_index, out):
    """``cross_entropy_backward_rows`` with scale = dloss[0] / n_valid[0] (0 when no row is
    valid): dloss (1,) the upstream gradient, n_valid (1,) from ``cross_entropy_mean``."""
    count = n_valid[0]
    scale = float(dloss[0]) / count if count > 0 else 0.0
    if out.size:
        cross_entropy_backward_rows(logits, target, lse, scale, ignore_index, out)


def first_invalid_target(target, C, ignore_index):
    """The index of the first entry of ``target`` (N,) outside [0, C) that is not
    ``ignore_index``, or None when every target is valid (read here, on the host)."""
    bad = np.flatnonzero((target != ignore_index) & ((target < 0) | (target >= C)))
    return int(bad[0]) if bad.size else None
