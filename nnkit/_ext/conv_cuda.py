"""Convolution and pooling on NVIDIA GPUs: Numba CUDA kernels.

Every kernel is a gather (each thread owns one element it writes), so there are no atomics
and the results are deterministic; sums run in float64.

- convolution, as on the CPU, is im2col + GEMM (``nnkit.kernels.conv`` composes them, the
  GEMMs in cuBLAS through CuPy): ``im2col`` (thread per element of cols) and its adjoint
  ``col2im`` (thread per dx[n, c, h, w], summing the dcols entries of the taps (i, j) with
  a s_h + i d_h - pt = h and b s_w + j d_w - pl = w);
- pooling: ``max_pool`` (torch's argmax rule), ``max_pool_backward`` (thread per input
  element, gathering the windows whose argmax is that element), ``avg_pool`` and
  ``avg_pool_backward`` (torch's divisor: ``conv_cpu.avg_divisor`` as a device function).
  ceil_mode enters through the output shape only: every kernel clips its windows.

Launchers take CuPy arrays, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``; ``threads`` (per block) is a module variable the tests lower.
"""

from __future__ import annotations

import math

from numba import cuda, float64

from ._launch import launch
from .conv_cpu import _valid_range, avg_divisor

__all__ = ["im2col", "col2im", "max_pool", "max_pool_backward", "avg_pool", "avg_pool_backward"]

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
    s = 0.0
    for i in range(kh):
        hh = h + pt - i * dh
        if hh < 0 or hh % sh != 0 or hh // sh >= Ho:
            continue
        a = hh // sh
        for j in range(kw):
            ww = xw + pl - j * dw
            if ww < 0 or ww % sw != 0 or ww // sw >= Wo:
                continue
            s += float64(dcols[(c * kh + i) * kw + j, (n * Ho + a) * Wo + ww // sw])
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
    best = -math.inf
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
    s = 0.0
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
                s += float64(dy[n, c, a, bb])
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
    s = 0.0
    for h in range(max(h0, 0), min(h0 + kh, H)):
        for ww in range(max(w0, 0), min(w0 + kw, W)):
            s += float64(x[n, c, h, ww])
    y[n, c, a, bb] = s / _avg_divisor(h0, w0, kh, kw, H, W, ph, pw, count_include_pad, divisor)


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
    s = 0.0
    a0, a1 = _windows_holding(h + ph, kh, sh, 1, Ho)
    b0, b1 = _windows_holding(xw + pw, kw, sw, 1, Wo)
    for a in range(a1 - 1, a0 - 1, -1):  # tap i ascending, as a sum order
        for bb in range(b1 - 1, b0 - 1, -1):
            div = _avg_divisor(a * sh - ph, bb * sw - pw, kh, kw, H, W, ph, pw,
                               count_include_pad, divisor)
            s += float64(dy[n, c, a, bb]) / div
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
        launch(_max_pool_kernel, _blocks(y.size), threads, x, *kernel, *stride, *padding,
               *dilation, y, idx)


def max_pool_backward(dy, idx, kernel, stride, padding, dilation, dx):
    """dx[n, c, h, w] = sum of dy over the windows whose argmax is (h, w)."""
    if dx.size:
        launch(_max_pool_bwd_kernel, _blocks(dx.size), threads, dy, idx, *kernel, *stride,
               *padding, *dilation, dx)


def avg_pool(x, kernel, stride, padding, count_include_pad, divisor, y):
    """y = window mean; divisor ``conv_cpu.avg_divisor`` (divisor_override if nonzero)."""
    if y.size:
        launch(_avg_pool_kernel, _blocks(y.size), threads, x, *kernel, *stride, *padding,
               count_include_pad, divisor, y)


def avg_pool_backward(dy, kernel, stride, padding, count_include_pad, divisor, dx):
    """dx = sum over the windows holding (h, w) of dy / divisor."""
    if dx.size:
        launch(_avg_pool_bwd_kernel, _blocks(dx.size), threads, dy, *kernel, *stride, *padding,
               count_include_pad, divisor, dx)
