"""Convolution and pooling on NVIDIA GPUs: Numba CUDA kernels and the launchers of
``nnkit.kernels.conv`` for GPU arrays (the names of ``nnkit.kernels.conv.cpu``'s, so that
``nnkit._backend.kernels_for`` picks between the two modules).

Every kernel is a gather (each thread owns one element it writes), so there are no atomics
and the results are deterministic; sums run in the storage dtype, as torch's CUDA kernels
accumulate float32 in float32 (col2im and the pooling backwards sum a few taps or windows
per element; an average pool sums its window).

- convolution, as the CPU's batch-wide path, is im2col + GEMM: ``conv2d_forward(x, weight,
  bias, cache)`` fills cols with ``im2col`` (thread per element of cols) and runs
  Y = W @ cols per group in cuBLAS (CuPy's matmul; NumPy's under the simulator), the bias
  added in the transpose back to NCHW; ``conv2d_backward(dy, cache, needs)`` runs
  dW = dY @ cols^T and dcols = W^T @ dY per group and ``col2im`` (thread per dx[n, c, h, w],
  summing the dcols entries of the taps (i, j) with a s_h + i d_h - pt = h and
  b s_w + j d_w - pl = w). The direct kernels (one thread per output) this replaced reached a
  few percent of cuDNN (benchmarks/RESULTS.md, "On an NVIDIA H100");
- pooling: ``max_pool`` (torch's argmax rule), ``max_pool_backward`` (thread per input
  element, gathering the windows whose argmax is that element), ``avg_pool`` and
  ``avg_pool_backward`` (torch's divisor: ``conv_cpu.avg_divisor`` as a device function).
  ceil_mode enters through the output shape only: every kernel clips its windows.

Launchers take CuPy arrays, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``; ``threads`` (per block) is a module variable the tests lower.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .._backend import array_module
from ._launch import launch
from .conv_cpu import _valid_range, avg_divisor
from .launchers import launchers

__all__ = [*launchers("nnkit.kernels.conv.cpu", "conv_cuda"), "im2col", "col2im"]

threads = 128


def _blocks(n):
    return max(1, (n + threads - 1) // threads)


@cuda.jit
def _im2col_kernel(x, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, cols):
    """cols[(c kh + i) kw + j, (n Ho + a) Wo + b] = xpad[n, c, a sh + i dh, b sw + j dw]; one
    thread per element of cols, neighbouring threads on neighbouring columns."""
    t = cuda.grid(1)
    R, M = cols.shape
    if t >= R * M:
        return
    m, r = t % M, t // M
    j, i, c = r % kw, (r // kw) % kh, r // (kw * kh)
    bb, a, n = m % Wo, (m // Wo) % Ho, m // (Wo * Ho)
    h, w = a * sh - pt + i * dh, bb * sw - pl + j * dw
    if h >= 0 and h < x.shape[2] and w >= 0 and w < x.shape[3]:
        cols[r, m] = x[n, c, h, w]
    else:
        cols[r, m] = 0


@cuda.jit
def _col2im_kernel(dcols, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, dx):
    """dx[n, c, h, w] = the sum of the dcols entries im2col read from x[n, c, h, w]: a
    gather over the taps (i, j) with a sh + i dh - pt = h and b sw + j dw - pl = w."""
    t = cuda.grid(1)
    N, C, H, W = dx.shape
    if t >= N * C * H * W:
        return
    xw = t % W
    h = (t // W) % H
    c = (t // (W * H)) % C
    n = t // (W * H * C)
    s = dx.dtype.type(0)  # typed: a Python float would promote float32 to float64
    for i in range(kh):
        hh = h + pt - i * dh
        if hh < 0 or hh % sh != 0 or hh // sh >= Ho:
            continue
        a = hh // sh
        for j in range(kw):
            ww = xw + pl - j * dw
            if ww < 0 or ww % sw != 0 or ww // sw >= Wo:
                continue
            s += dcols[(c * kh + i) * kw + j, (n * Ho + a) * Wo + ww // sw]
    dx[n, c, h, xw] = s


@cuda.jit
def _max_pool_kernel(x, kh, kw, sh, sw, ph, pw, dh, dw, y, idx):
    t = cuda.grid(1)
    N, C, Ho, Wo = y.shape
    if t >= N * C * Ho * Wo:
        return
    bb = t % Wo
    a = (t // Wo) % Ho
    c = (t // (Wo * Ho)) % C
    n = t // (Wo * Ho * C)
    H, W = x.shape[2], x.shape[3]
    best = y.dtype.type(-math.inf)
    arg = -1
    # only the in-bounds taps (row-major order kept): a window may span 2^31 taps
    i0, i1 = _valid_range_dev(kh, H, dh, a * sh - ph)
    j0, j1 = _valid_range_dev(kw, W, dw, bb * sw - pw)
    for i in range(i0, i1):
        h = a * sh - ph + i * dh
        for j in range(j0, j1):
            ww = bb * sw - pw + j * dw
            v = x[n, c, h, ww]
            if arg < 0 or v > best or math.isnan(v):
                best = v
                arg = h * W + ww
    y[n, c, a, bb] = best
    idx[n, c, a, bb] = arg


@cuda.jit
def _max_pool_bwd_kernel(dy, idx, kh, kw, sh, sw, ph, pw, dh, dw, dx):
    t = cuda.grid(1)
    N, C, H, W = dx.shape
    if t >= N * C * H * W:
        return
    xw = t % W
    h = (t // W) % H
    c = (t // (W * H)) % C
    n = t // (W * H * C)
    Ho, Wo = dy.shape[2], dy.shape[3]
    me = h * W + xw
    s = dx.dtype.type(0)
    # the windows holding (h, xw): a loop over outputs (at most Ho Wo), not over the kernel's
    # kh kw taps, which may number 2^62
    a0, a1 = _windows_holding(h + ph, kh, sh, dh, Ho)
    b0, b1 = _windows_holding(xw + pw, kw, sw, dw, Wo)
    for a in range(a1 - 1, a0 - 1, -1):  # tap i ascending, as a sum order
        if (h + ph - a * sh) % dh != 0:
            continue
        for bb in range(b1 - 1, b0 - 1, -1):
            if (xw + pw - bb * sw) % dw != 0:
                continue
            if idx[n, c, a, bb] == me:
                s += dy[n, c, a, bb]
    dx[n, c, h, xw] = s


_avg_divisor = cuda.jit(device=True)(avg_divisor)
_valid_range_dev = cuda.jit(device=True)(_valid_range)


@cuda.jit(device=True)
def _windows_holding(p, k, s, d, n_out):
    """[lo, hi): the windows a in [0, n_out) whose taps a s + i d (i in [0, k)) span the
    padded coordinate p >= 0, i.e. a s <= p <= a s + (k - 1) d (the tap's congruence mod d
    is the caller's check)."""
    lo = 0
    reach = (k - 1) * d
    if p - reach > 0:
        lo = min(n_out, (p - reach + s - 1) // s)
    return lo, max(lo, min(n_out, p // s + 1))


@cuda.jit
def _avg_pool_kernel(x, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, y):
    t = cuda.grid(1)
    N, C, Ho, Wo = y.shape
    if t >= N * C * Ho * Wo:
        return
    bb = t % Wo
    a = (t // Wo) % Ho
    c = (t // (Wo * Ho)) % C
    n = t // (Wo * Ho * C)
    H, W = x.shape[2], x.shape[3]
    h0, w0 = a * sh - ph, bb * sw - pw
    s = y.dtype.type(0)
    for h in range(max(h0, 0), min(h0 + kh, H)):
        for ww in range(max(w0, 0), min(w0 + kw, W)):
            s += x[n, c, h, ww]
    y[n, c, a, bb] = s / y.dtype.type(_avg_divisor(h0, w0, kh, kw, H, W, ph, pw,
                                                   count_include_pad, divisor))


@cuda.jit
def _avg_pool_bwd_kernel(dy, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, dx):
    t = cuda.grid(1)
    N, C, H, W = dx.shape
    if t >= N * C * H * W:
        return
    xw = t % W
    h = (t // W) % H
    c = (t // (W * H)) % C
    n = t // (W * H * C)
    Ho, Wo = dy.shape[2], dy.shape[3]
    s = dx.dtype.type(0)
    a0, a1 = _windows_holding(h + ph, kh, sh, 1, Ho)
    b0, b1 = _windows_holding(xw + pw, kw, sw, 1, Wo)
    for a in range(a1 - 1, a0 - 1, -1):  # tap i ascending, as a sum order
        for bb in range(b1 - 1, b0 - 1, -1):
            div = _avg_divisor(a * sh - ph, bb * sw - pw, kh, kw, H, W, ph, pw,
                               count_include_pad, divisor)
            s += dy[n, c, a, bb] / dx.dtype.type(div)
    dx[n, c, h, xw] = s


def _geometry(stride, pads, dilation):
    (sh, sw), ((pt, _), (pl, _)), (dh, dw) = stride, pads, dilation
    return sh, sw, pt, pl, dh, dw


def im2col(x, kernel, stride, pads, dilation, out_hw, cols):
    """cols (C kh kw, N Ho Wo) of x (N, C, H, W); pads ((top, bottom), (left, right))."""
    if cols.size:
        launch(_im2col_kernel, _blocks(cols.size), threads, x, *kernel,
               *_geometry(stride, pads, dilation), *out_hw, cols)


def col2im(dcols, kernel, stride, pads, dilation, out_hw, dx):
    """dx (N, C, H, W) from dcols (C kh kw, N Ho Wo): the adjoint of ``im2col``."""
    if dx.size:
        launch(_col2im_kernel, _blocks(dx.size), threads, dcols, *kernel,
               *_geometry(stride, pads, dilation), *out_hw, dx)


def max_pool(x, kernel, stride, padding, dilation, y, idx):
    """y = window max, idx = h W + w of the routed maximum (torch's rule)."""
    if y.size:
        x = array_module(x).ascontiguousarray(x)
        launch(_max_pool_kernel, _blocks(y.size), threads, x, *kernel, *stride, *padding,
               *dilation, y, idx)


def max_pool_backward(dy, idx, kernel, stride, padding, dilation, dx):
    """dx[n, c, h, w] = sum of dy over the windows whose argmax is (h, w)."""
    if dx.size:
        dy = array_module(dy).ascontiguousarray(dy)
        launch(_max_pool_bwd_kernel, _blocks(dx.size), threads, dy, idx, *kernel, *stride,
               *padding, *dilation, dx)


def avg_pool(x, kernel, stride, padding, count_include_pad, divisor, y):
    """y = window mean; divisor ``conv_cpu.avg_divisor`` (divisor_override if nonzero)."""
    if y.size:
        x = array_module(x).ascontiguousarray(x)
        launch(_avg_pool_kernel, _blocks(y.size), threads, x, *kernel, *stride, *padding,
               count_include_pad, divisor, y)


def avg_pool_backward(dy, kernel, stride, padding, count_include_pad, divisor, dx):
    """dx = sum over the windows holding (h, w) of dy / divisor."""
    if dx.size:
        dy = array_module(dy).ascontiguousarray(dy)
        launch(_avg_pool_bwd_kernel, _blocks(dx.size), threads, dy, *kernel, *stride, *padding,
               count_include_pad, divisor, dx)


# ---- the convolution launchers ---------------------------------------------------------------

def _cache_geometry(cache):
    """``im2col``/``col2im``'s geometry arguments, from the cache."""
    return (cache.weight.shape[2:], cache.stride, cache.pads, cache.dilation, cache.out_hw)


def conv2d_forward(x, weight, bias, cache):
    """y (N, K, Ho, Wo): cols by ``im2col``, Y = W @ cols per group (one batched product),
    the bias added in the transpose; the cols stay in ``cache.cols`` for the backward."""
    xp = array_module(x)
    x, weight = xp.ascontiguousarray(x), xp.ascontiguousarray(weight)
    cache.x, cache.weight = x, weight
    N, C = x.shape[:2]
    K, G, P = weight.shape[0], cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * weight.shape[2] * weight.shape[3]
    cols = xp.empty((R, N * P), dtype=x.dtype)
    im2col(x, *_cache_geometry(cache), cols)
    ykn = xp.matmul(weight.reshape(G, K // G, R // G), cols.reshape(G, R // G, N * P))
    y = xp.empty((N, K, P), dtype=x.dtype)
    ynkp = ykn.reshape(K, N, P).transpose(1, 0, 2)
    if bias is None:
        y[...] = ynkp
    else:
        xp.add(ynkp, bias.reshape(1, K, 1), out=y)
    cache.cols = cols
    return y.reshape(N, K, *cache.out_hw)


def conv2d_backward(dy, cache, needs):
    """(dx, dweight, dbias): dW = dY @ cols^T and dcols = W^T @ dY per group (cuBLAS),
    dx = col2im(dcols), dbias the sums of dY; None where ``needs`` (x, weight, bias) says
    not wanted. The forward's cols are consumed (a second backward recomputes them)."""
    need_x, need_w, need_b = needs
    xp = array_module(dy)
    x, weight = cache.x, cache.weight
    N, C = x.shape[:2]
    K, G, P = weight.shape[0], cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * weight.shape[2] * weight.shape[3]
    dyt = xp.ascontiguousarray(dy.reshape(N, K, P).transpose(1, 0, 2)).reshape(K, N * P)
    dx = dw = db = None
    if need_w:
        cols = cache.cols
        if cols is None:  # a backward called twice: the first consumed the cols
            cols = xp.empty((R, N * P), dtype=x.dtype)
            im2col(x, *_cache_geometry(cache), cols)
        dw = xp.matmul(dyt.reshape(G, K // G, N * P),
                       cols.reshape(G, R // G, N * P).transpose(0, 2, 1)).reshape(weight.shape)
    if need_b:
        db = dyt.sum(axis=1, dtype=np.float64).astype(x.dtype)
    cache.cols = None
    if need_x:
        dcols = xp.matmul(weight.reshape(G, K // G, R // G).transpose(0, 2, 1),
                          dyt.reshape(G, K // G, N * P))
        dx = xp.empty(x.shape, dtype=x.dtype)
        col2im(dcols.reshape(R, N * P), *_cache_geometry(cache), dx)
    return dx, dw, db


def release(cache):
    """Drop the forward's cols (no backward will read them)."""
    cache.cols = None
