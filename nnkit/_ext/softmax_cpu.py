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

Why this is fast. Numba's ``math.exp`` is a scalar libm call here (llvmlite has no SVML), so
the kernels use ``exp_approx``: Cody-Waite range reduction ``z = n ln2 + r``, a polynomial
for ``exp(r)`` on ``|r| <= ln2/2`` and ``2**n`` built from exponent bits. The bit casts are
LLVM ``bitcast`` intrinsics, so every loop that calls it is a plain map loop that LLVM
vectorises with AVX-512. Relative error against float64 ``exp``: float32 <= 2 ulp (the
Cephes ``expf`` minimax polynomial, degree 5 after ``1 + r``), float64 <= 2 ulp (Taylor to
degree 13); subnormal results are produced by scaling in two steps; NaN propagates,
``exp(-inf) = 0`` and overflow gives ``inf``. Row maxima use LLVM's NaN-propagating ``llvm.maximum``
(a compare-and-select max loop does not vectorise); row sums go through small helpers
compiled with ``fastmath={'reassoc'}`` only (see ``_exp_shift_sum``).

Each launcher is a plain Python function (the debugging path: it runs uncompiled with
``NUMBA_DISABLE_JIT=1``) compiled with ``numba.njit(cache=True, parallel=True)``; rows run
in ``prange`` chunks, per-thread scratch is allocated once per chunk.
"""

from __future__ import annotations

import math

import llvmlite.binding
import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic, overload

from ._dispatch import serial_or_parallel

__all__ = [
    "exp_approx",
    "softmax_rows",
    "log_softmax_rows",
    "softmax_backward_rows",
    "log_softmax_backward_rows",
    "cross_entropy_rows",
    "cross_entropy_backward_rows",
]

_N_CHUNKS = 64  # prange chunks of rows in cross-entropy (each allocates its scratch once)
_SUM_BLOCK = 1024  # columns per float32 partial sum (then added in float64)
_BLOCK = 4096  # columns of per-thread scratch in cross-entropy (at most 32 KiB: in L1)

# --------------------------------------------------------------------------------------
# Bit casts: plain Python for the debugging path, an LLVM bitcast when compiled.


def _f32_as_i32(v):
    return np.float32(v).view(np.int32)


def _i32_as_f32(v):
    return np.int32(v).view(np.float32)


def _f64_as_i64(v):
    return np.float64(v).view(np.int64)


def _i64_as_f64(v):
    return np.int64(v).view(np.float64)


def _bitcast_intrinsic(src, dst, llvm_dst):
    """An intrinsic reinterpreting the bits of a ``src`` value as ``dst``. Integer sources
    of another width are truncated first (Numba widens int32 arithmetic to int64; LLVM
    narrows the arithmetic back before vectorising)."""

    @intrinsic
    def _cast(typingctx, v):
        if isinstance(src, types.Integer):
            if not isinstance(v, types.Integer):
                return None
        elif v != src:
            return None

        def codegen(context, builder, signature, args):
            value = args[0]
            if isinstance(src, types.Integer) and v.bitwidth != src.bitwidth:
                value = builder.trunc(value, ir.IntType(src.bitwidth))
            return builder.bitcast(value, llvm_dst)

        return dst(v), codegen

    return _cast


_cast_f32_i32 = _bitcast_intrinsic(types.float32, types.int32, ir.IntType(32))
_cast_i32_f32 = _bitcast_intrinsic(types.int32, types.float32, ir.FloatType())
_cast_f64_i64 = _bitcast_intrinsic(types.float64, types.int64, ir.IntType(64))
_cast_i64_f64 = _bitcast_intrinsic(types.int64, types.float64, ir.DoubleType())


@overload(_f32_as_i32)
def _ov_f32_as_i32(v):
    return lambda v: _cast_f32_i32(v)


@overload(_i32_as_f32)
def _ov_i32_as_f32(v):
    return lambda v: _cast_i32_f32(v)


@overload(_f64_as_i64)
def _ov_f64_as_i64(v):
    return lambda v: _cast_f64_i64(v)


@overload(_i64_as_f64)
def _ov_i64_as_f64(v):
    return lambda v: _cast_i64_f64(v)


def _ldexp(p, k):
    """p * 2**k: LLVM's ``llvm.ldexp`` when compiled (one ``vscalefps`` with AVX-512,
    exact, subnormal results and overflow included)."""
    return np.ldexp(p, int(k)).astype(type(p)) if isinstance(p, np.floating) else p * 2.0**k


@intrinsic
def _llvm_ldexp(typingctx, p, k):
    if not isinstance(p, types.Float) or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ll, i32 = args[0].type, ir.IntType(32)
        k = args[1] if k_bits == 32 else builder.trunc(args[1], i32)
        fnty = ir.FunctionType(ll, [ll, i32])
        fn = builder.module.declare_intrinsic("llvm.ldexp", [ll, i32], fnty)
        return builder.call(fn, [args[0], k])

    k_bits = k.bitwidth
    return p(p, k), codegen


@overload(_ldexp)
def _ov_ldexp(p, k):
    return lambda p, k: _llvm_ldexp(p, k)


# With AVX-512, 2**n is one vscalef (llvm.ldexp); elsewhere llvm.ldexp is a libm call, so
# 2**n is built from exponent bits instead (two factors, to reach the subnormal range).
_USE_LDEXP = "+avx512f" in llvmlite.binding.get_host_cpu_features().flatten()

# --------------------------------------------------------------------------------------
# exp by range reduction and polynomial (vectorisable: no calls, no branches).

_F32_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer
_F32_MAGIC_BITS = np.int32(0x4B400000)
_F64_MAGIC = 6755399441055744.0  # 1.5 * 2**52
_F64_MAGIC_BITS = np.int64(0x4338000000000000)


def _exp_f32(z):
    """exp(z) for float32 z: Cephes expf's reduction and polynomial, 2**n in two steps."""
    z = np.float32(-104.0) if z < np.float32(-104.0) else z  # exp(-104) rounds to 0
    z = np.float32(89.0) if z > np.float32(89.0) else z  # exp(89) overflows to inf
    t = z * np.float32(1.4426950408889634) + _F32_MAGIC  # n = round(z / ln2), in t's bits
    n = t - _F32_MAGIC
    r = z - n * np.float32(0.693359375)  # ln2 split in two (Cody-Waite); n * hi is exact
    r = r - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    k = _f32_as_i32(t) - _F32_MAGIC_BITS  # n as an integer (NaN gives garbage, p stays NaN)
    if _USE_LDEXP:
        return _ldexp(p, k)
    h = k >> 1  # 2**n = 2**h * 2**(n - h): both factors normal for n in [-150, 129]
    return p * _i32_as_f32((h + 127) << 23) * _i32_as_f32((k - h + 127) << 23)


def _exp_f64(z):
    """exp(z) for float64 z: Cephes exp's ln2 split, Taylor to degree 13 on |r| <= ln2/2."""
    z = -746.0 if z < -746.0 else z
    z = 710.0 if z > 710.0 else z
    t = z * 1.4426950408889634 + _F64_MAGIC
    n = t - _F64_MAGIC
    r = z - n * 6.93145751953125e-1
    r = r - n * 1.42860682030941723212e-6
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r * r + r + 1.0
    k = _f64_as_i64(t) - _F64_MAGIC_BITS
    if _USE_LDEXP:
        return _ldexp(p, k)
    h = k >> 1
    return p * _i64_as_f64((h + 1023) << 52) * _i64_as_f64((k - h + 1023) << 52)


def exp_approx(z):
    """Vectorisable exp for a float32 or float64 scalar (the dtype is kept)."""
    if isinstance(z, np.float32):
        return _exp_f32(z)
    return _exp_f64(np.float64(z))


# fastmath={'contract'} only: lets LLVM fuse a*b + c into one FMA (one rounding instead of
# two, ~25% faster); no nnan/ninf/reassoc, so NaN and inf propagate and the Cody-Waite and
# magic-number steps are evaluated as written.
_exp_f32_jit = numba.njit(cache=True, fastmath={"contract"})(_exp_f32)
_exp_f64_jit = numba.njit(cache=True, fastmath={"contract"})(_exp_f64)


@overload(exp_approx)
def _ov_exp_approx(z):
    if z == types.float32:
        return lambda z: _exp_f32_jit(z)
    if z == types.float64:
        return lambda z: _exp_f64_jit(z)
    return None


# --------------------------------------------------------------------------------------
# Row reductions.


def fmax(a, b):
    """max(a, b) propagating NaN (LLVM's ``llvm.maximum``, which vectorises as a reduction;
    a compare-and-select max loop does not)."""
    if a != a or b != b:
        return a + b
    return a if a >= b else b


@intrinsic
def _llvm_maximum(typingctx, a, b):
    if a != b or not isinstance(a, types.Float):
        return None

    def codegen(context, builder, signature, args):
        ll = args[0].type
        fn = builder.module.declare_intrinsic("llvm.maximum", [ll], ir.FunctionType(ll, [ll, ll]))
        return builder.call(fn, args)

    return a(a, b), codegen


@overload(fmax)
def _ov_fmax(a, b):
    return lambda a, b: _llvm_maximum(a, b)


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
        # row-dtype arithmetic, which vectorises (about 2x faster in float32:
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
