"""Convolution and pooling on the CPU: Numba kernels around numpy's BLAS GEMM.

The convolution is lowered to GEMMs (the paths and why each shape takes its own are written
in ``nnkit.kernels.conv.algorithms`` and ``nnkit.kernels.conv.cpu``). These kernels do the
data movement around them:

- ``im2col``: cols[(c kh + i) kw + j, (n Ho + a) Wo + b] = xpad[n, c, a sh + i dh, b sw + j dw]
  (zero outside the image); prange over the rows of cols, each written contiguously by
  indexed loops over flat arrays with unsigned indices (vectorised; faster than slice
  copies: benchmarks/RESULTS.md, "Figures moved from docstrings");
- ``col2im``: the adjoint, dx[n, c, h, w] = sum of the cols entries that read (h, w); prange
  over (n, c) planes, so no two threads write the same element (deterministic);
- ``bias_transpose``: y[n, k, p] = ykn[k, n, p] + bias[k] (GEMM output back to NCHW);
- ``transpose_sum``: dyt[k, n, p] = dy[n, k, p] and dbias[k] = sum_{n, p} dy[n, k, p];
- pooling: ``max_pool`` (window argmax with torch's rule ``v > best or isnan(v)``, i.e. the
  first maximum in row-major order, the last NaN), ``max_pool_backward`` (scatter to the
  argmax, one (n, c) plane per thread), ``avg_pool`` and ``avg_pool_backward`` (torch's
  divisor, ``avg_divisor``: divisor_override, or the window clipped to the padded input, or
  its in-bounds count). ceil_mode enters through the output shape only: every kernel clips
  its windows at the input's edge.

Serial or parallel: each launcher runs its parallel build only when the array it fills or
reads holds at least ``PARALLEL_MIN_ELEMENTS`` = 2^20 elements (4 MiB of float32), not the
2^16 of ``_dispatch``: these kernels move a few bytes per element, so below that size
waking the pool (tens of microseconds; on a busy 2-core machine a scheduler slice of several
milliseconds, benchmarks/RESULTS.md) costs more than the second core saves. The
convolution's batch-wide path (``nnkit.kernels.conv.cpu``) calls the serial builds of
im2col, col2im, bias_transpose and transpose_sum outright: their OpenMP workers and
OpenBLAS's threads, both spinning after a call, slow each other's next call (reasons there).

No fastmath: pure data movement and sums whose order is fixed. Kernels validate nothing and
take C-contiguous arrays with preallocated outputs.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .._machine import parallel_pays
from ._dispatch import nogil_build, serial_or_parallel

__all__ = ["im2col", "col2im", "im2col_nogil", "col2im_nogil", "bias_transpose",
           "transpose_sum", "max_pool", "max_pool_backward", "avg_pool", "avg_pool_backward",
           "avg_divisor",
           "direct_forward", "direct_backward_input", "direct_backward_weight",
           "direct_backward_bias"]


def _valid_range(n_out, size, stride, offset):
    """[lo, hi) with 0 <= lo <= hi <= n_out: the b in [0, n_out) with
    0 <= b stride + offset < size (lo = hi when there are none). Callers index with
    b in [0, lo) and [hi, n_out) too, so both ends are clamped into [0, n_out]. No int64
    overflow for offset and stride within the validated bounds (|offset|, stride < 2^62)."""
    lo = 0
    if offset < 0:
        lo = min(n_out, (-offset + stride - 1) // stride)
    hi = 0
    if size - 1 - offset >= 0:
        hi = (size - 1 - offset) // stride + 1
    return lo, max(lo, min(n_out, hi))


_valid_range_jit = numba.njit(cache=True, inline="always")(_valid_range)


def _im2col(x, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, cols):
    """cols (C kh kw, N Ho Wo) from x (N, C, H, W); see the module docstring."""
    N, C, H, W = x.shape
    NP = N * Ho * Wo
    xf = x.reshape(-1)
    cf = cols.reshape(-1)
    for r in numba.prange(C * kh * kw):
        c = r // (kh * kw)
        i = (r // kw) % kh
        j = r % kw
        w0 = j * dw - pl
        lo, hi = _valid_range_jit(Wo, W, sw, w0)
        # flat unsigned indices: no wraparound check, so LLVM vectorises the copies
        for n in range(N):
            for a in range(Ho):
                h = a * sh - pt + i * dh
                o = np.uint64(r * NP + (n * Ho + a) * Wo)
                if h < 0 or h >= H:
                    for b in range(Wo):
                        cf[o + np.uint64(b)] = 0
                    continue
                for b in range(lo):
                    cf[o + np.uint64(b)] = 0
                src = np.uint64(((n * C + c) * H + h) * W + w0 + lo * sw)
                dst = o + np.uint64(lo)
                if sw == 1:
                    for t in range(hi - lo):
                        cf[dst + np.uint64(t)] = xf[src + np.uint64(t)]
                else:
                    for t in range(hi - lo):
                        cf[dst + np.uint64(t)] = xf[src + np.uint64(t * sw)]
                for b in range(hi, Wo):
                    cf[o + np.uint64(b)] = 0


def _col2im(cols, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, dx):
    """dx (N, C, H, W) = adjoint of im2col applied to cols (C kh kw, N Ho Wo)."""
    N, C, H, W = dx.shape
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        plane = dx[n, c]  # (H, W)
        plane[:, :] = 0
        for i in range(kh):
            for j in range(kw):
                crow = cols[(c * kh + i) * kw + j]  # (N Ho Wo,)
                w0 = j * dw - pl
                lo, hi = _valid_range_jit(Wo, W, sw, w0)
                for a in range(Ho):
                    h = a * sh - pt + i * dh
                    if h < 0 or h >= H:
                        continue
                    o = (n * Ho + a) * Wo
                    if sw == 1:  # unsigned indices: no wraparound check, so LLVM vectorises
                        src = crow[o + lo:o + hi]
                        dst = plane[h, lo + w0:hi + w0]
                        for t in range(src.shape[0]):
                            dst[np.uint64(t)] += src[np.uint64(t)]
                    else:
                        for b in range(lo, hi):
                            plane[h, b * sw + w0] += crow[o + b]


def _bias_transpose(ykn, bias, has_bias, y):
    """y[n, k, p] = ykn[k, n, p] (+ bias[k]); ykn (K, N, P), y (N, K, P)."""
    K, N, P = ykn.shape
    yf = y.reshape(-1)
    sf = ykn.reshape(-1)
    for nk in numba.prange(N * K):
        n = nk // K
        k = nk % K
        b = bias[k] if has_bias else bias[0] * 0  # the array's dtype (a literal 0 is int64)
        src = np.uint64((k * N + n) * P)
        dst = np.uint64(nk * P)
        for p in range(P):
            yf[dst + np.uint64(p)] = sf[src + np.uint64(p)] + b


def _transpose_sum(dy, dyt, dbias):
    """dyt[k, n, p] = dy[n, k, p]; dbias[k] = sum_{n, p} dy[n, k, p] (float64 accumulator)."""
    N, K, P = dy.shape
    for k in numba.prange(K):
        s = 0.0
        for n in range(N):
            for p in range(P):
                v = dy[n, k, p]
                dyt[k, n, p] = v
                s += v
        dbias[k] = s


def _max_pool(x, kh, kw, sh, sw, ph, pw, dh, dw, y, idx):
    """y (N, C, Ho, Wo) = window max; idx = h W + w of the routed maximum.

    The columns whose windows lie wholly inside the row (all kw taps in bounds) run tap by
    tap over vectors of outputs (``best``, ``arg``: the same rule, taps in the same
    row-major order, so the same maximum is routed), which LLVM vectorises; the few edge
    columns run the scalar loop."""
    N, C, H, W = x.shape
    Ho, Wo = y.shape[2], y.shape[3]
    # columns b with 0 <= b sw - pw and b sw - pw + (kw - 1) dw < W
    b0, _ = _valid_range_jit(Wo, W, sw, -pw)
    _, b1 = _valid_range_jit(Wo, W, sw, -pw + (kw - 1) * dw)
    b1 = max(b0, b1)
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        best = np.empty(max(b1 - b0, 1), dtype=x.dtype)
        arg = np.empty(max(b1 - b0, 1), dtype=np.int64)
        for a in range(Ho):
            i0, i1 = _valid_range_jit(kh, H, dh, a * sh - ph)
            for b in range(Wo):
                if b0 <= b < b1 and i1 > i0:
                    continue
                best_s = -math.inf
                arg_s = -1
                # only the in-bounds taps (row-major order kept): a window may span 2^31
                j0, j1 = _valid_range_jit(kw, W, dw, b * sw - pw)
                for i in range(i0, i1):
                    h = a * sh - ph + i * dh
                    for j in range(j0, j1):
                        w = b * sw - pw + j * dw
                        v = x[n, c, h, w]
                        if arg_s < 0 or v > best_s or math.isnan(v):
                            best_s = v
                            arg_s = h * W + w
                y[n, c, a, b] = best_s
                idx[n, c, a, b] = arg_s
            if b1 <= b0 or i1 <= i0:
                continue
            first = True
            for i in range(i0, i1):
                h = a * sh - ph + i * dh
                row = x[n, c, h]
                for j in range(kw):
                    o = b0 * sw - pw + j * dw  # column of tap j for output b0
                    if first:
                        for t in range(b1 - b0):
                            u = np.uint64(t)
                            best[u] = row[np.uint64(o + t * sw)]
                            arg[u] = h * W + o + t * sw
                        first = False
                        continue
                    base = h * W + o
                    for t in range(b1 - b0):
                        u = np.uint64(t)
                        v = row[np.uint64(o + t * sw)]
                        take = (v > best[u]) | (v != v)  # no short circuit: a select
                        best[u] = v if take else best[u]
                        arg[u] = base + t * sw if take else arg[u]
            yo = y[n, c, a]
            io = idx[n, c, a]
            for t in range(b1 - b0):
                yo[np.uint64(b0 + t)] = best[np.uint64(t)]
                io[np.uint64(b0 + t)] = arg[np.uint64(t)]


def _max_pool_backward(dy, idx, dx):
    """dx[n, c] = 0, then dx[n, c].flat[idx[n, c, a, b]] += dy[n, c, a, b]."""
    N, C, H, W = dx.shape
    Ho, Wo = dy.shape[2], dy.shape[3]
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        for h in range(H):
            for w in range(W):
                dx[n, c, h, w] = 0
        for a in range(Ho):
            for b in range(Wo):
                t = idx[n, c, a, b]
                if t >= 0:
                    dx[n, c, t // W, t % W] += dy[n, c, a, b]


def avg_divisor(h0, w0, kh, kw, H, W, ph, pw, count_include_pad, divisor):
    """torch's divisor for the window whose top-left tap is (h0, w0) (may be in the padding):
    ``divisor`` (divisor_override) if nonzero, else the window clipped to the padded input
    (count_include_pad: kh kw except for ceil_mode's last windows), else its in-bounds count
    (at least 1). Plain Python: jitted here and as a CUDA device function in conv_cuda."""
    if divisor != 0:
        return divisor
    if count_include_pad:
        return (min(h0 + kh, H + ph) - h0) * (min(w0 + kw, W + pw) - w0)
    return max(1, max(0, min(h0 + kh, H) - max(h0, 0)) * max(0, min(w0 + kw, W) - max(w0, 0)))


_avg_divisor_jit = numba.njit(cache=True, inline="always")(avg_divisor)


def _avg_pool(x, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, y):
    """y = sum of the window's in-bounds entries / ``avg_divisor``.

    The columns whose windows lie inside the row sum tap by tap over vectors of outputs (the
    taps in the same order, so the same sums), which LLVM vectorises; the edge columns run
    the scalar loop."""
    N, C, H, W = x.shape
    Ho, Wo = y.shape[2], y.shape[3]
    b0, _ = _valid_range_jit(Wo, W, sw, -pw)
    _, b1 = _valid_range_jit(Wo, W, sw, -pw + kw - 1)
    b1 = max(b0, b1)
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        acc = np.empty(max(b1 - b0, 1), dtype=np.float64)
        for a in range(Ho):
            h0 = a * sh - ph
            hlo, hhi = max(h0, 0), min(h0 + kh, H)
            for b in range(Wo):
                if b0 <= b < b1:
                    continue
                w0 = b * sw - pw
                s = 0.0
                for h in range(hlo, hhi):
                    for w in range(max(w0, 0), min(w0 + kw, W)):
                        s += x[n, c, h, w]
                y[n, c, a, b] = s / _avg_divisor_jit(h0, w0, kh, kw, H, W, ph, pw,
                                                     count_include_pad, divisor)
            if b1 <= b0:
                continue
            for t in range(b1 - b0):
                acc[np.uint64(t)] = 0.0
            for h in range(hlo, hhi):
                row = x[n, c, h]
                for w in range(kw):
                    o = b0 * sw - pw + w
                    for t in range(b1 - b0):
                        acc[np.uint64(t)] += row[np.uint64(o + t * sw)]
            out = y[n, c, a]
            for t in range(b1 - b0):
                b = b0 + t
                out[np.uint64(b)] = acc[np.uint64(t)] / _avg_divisor_jit(
                    h0, b * sw - pw, kh, kw, H, W, ph, pw, count_include_pad, divisor)


def _avg_pool_backward(dy, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, dx):
    """dx[n, c, h, w] = sum over the windows holding (h, w) of dy / ``avg_divisor``.

    As in ``_avg_pool``, the columns whose windows lie inside the row add their share tap by
    tap over vectors of outputs (one tap's columns are distinct, so no two lanes write one
    element), the edge columns one by one."""
    N, C, H, W = dx.shape
    Ho, Wo = dy.shape[2], dy.shape[3]
    b0, _ = _valid_range_jit(Wo, W, sw, -pw)
    _, b1 = _valid_range_jit(Wo, W, sw, -pw + kw - 1)
    b1 = max(b0, b1)
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        g = np.empty(max(b1 - b0, 1), dtype=dx.dtype)
        for h in range(H):
            for w in range(W):
                dx[n, c, h, w] = 0
        for a in range(Ho):
            h0 = a * sh - ph
            hlo, hhi = max(h0, 0), min(h0 + kh, H)
            for b in range(Wo):
                if b0 <= b < b1:
                    continue
                w0 = b * sw - pw
                gb = dy[n, c, a, b] / _avg_divisor_jit(h0, w0, kh, kw, H, W, ph, pw,
                                                       count_include_pad, divisor)
                for h in range(hlo, hhi):
                    for w in range(max(w0, 0), min(w0 + kw, W)):
                        dx[n, c, h, w] += gb
            if b1 <= b0:
                continue
            for t in range(b1 - b0):
                b = b0 + t
                g[np.uint64(t)] = dy[n, c, a, b] / _avg_divisor_jit(
                    h0, b * sw - pw, kh, kw, H, W, ph, pw, count_include_pad, divisor)
            for h in range(hlo, hhi):
                row = dx[n, c, h]
                for w in range(kw):
                    o = b0 * sw - pw + w
                    for t in range(b1 - b0):
                        row[np.uint64(o + t * sw)] += g[np.uint64(t)]


PARALLEL_MIN_ELEMENTS = 1 << 20


def _by_size(fn, size_arg):
    """serial_or_parallel(fn), choosing by the size of argument ``size_arg`` (see above)."""
    builds = serial_or_parallel(fn)

    def launcher(*args):
        big = parallel_pays(args[size_arg].size, PARALLEL_MIN_ELEMENTS)
        return (builds.parallel if big else builds.serial)(*args)

    launcher.serial, launcher.parallel = builds.serial, builds.parallel
    launcher.__name__ = launcher.__qualname__ = fn.__name__.lstrip("_")
    launcher.__doc__ = fn.__doc__
    return launcher


im2col = _by_size(_im2col, -1)  # cols
col2im = _by_size(_col2im, 0)  # cols
# serial builds without the GIL: the per-image convolution runs them from Python threads
im2col_nogil = nogil_build(_im2col)
col2im_nogil = nogil_build(_col2im)
bias_transpose = _by_size(_bias_transpose, 0)
transpose_sum = _by_size(_transpose_sum, 0)
max_pool = _by_size(_max_pool, 0)
max_pool_backward = _by_size(_max_pool_backward, -1)  # dx
avg_pool = _by_size(_avg_pool, 0)
avg_pool_backward = _by_size(_avg_pool_backward, -1)  # dx


# ---- direct convolution (depthwise layers) ------------------------------------------------
# For any groups; ``nnkit.kernels.conv.cpu`` runs them for depthwise layers (one input
# channel a group), where im2col's GEMMs would have one row. They work on zero-padded planes
# (P, (H + pt + pb) x (W + pl + pr)): each output row is a sum of Cg kh kw scaled input rows,
# a unit-stride (stride 1) or strided run that LLVM vectorises (3x3 kernels: the nine taps
# of a row in one pass, ``_row_taps3x3``). The weight gradient keeps a
# vector of partial sums per tap (a scalar reduction would stay unvectorised without
# fastmath) and adds it up in float64 at the end.


@numba.njit(cache=True, inline="always")
def _pad_planes(x, n, c0, c1, pt, pl, P):
    """P[c - c0] = x[n, c] placed at (pt, pl) in zeros, for c in [c0, c1)."""
    H, W = x.shape[2], x.shape[3]
    for c in range(c0, c1):
        plane = P[c - c0]
        plane[:, :] = 0
        for h in range(H):
            row = plane[pt + h]
            src = x[n, c, h]
            for w in range(W):
                row[np.uint64(pl + w)] = src[np.uint64(w)]


@numba.njit(cache=True, inline="always")
def _row_taps3x3(out, plane, f, top, dh, dw, sw):
    """out[b] += sum_{i, j < 3} f[i, j] plane[top + i dh, b sw + j dw]: the nine taps of a
    3x3 kernel in one pass over the output row (tap by tap, the row would be loaded and
    stored nine times)."""
    r0, r1, r2 = plane[top], plane[top + dh], plane[top + 2 * dh]
    f00, f01, f02 = f[0, 0], f[0, 1], f[0, 2]
    f10, f11, f12 = f[1, 0], f[1, 1], f[1, 2]
    f20, f21, f22 = f[2, 0], f[2, 1], f[2, 2]
    d2 = 2 * dw
    for b in range(out.shape[0]):
        o = b * sw
        out[np.uint64(b)] += (f00 * r0[np.uint64(o)] + f01 * r0[np.uint64(o + dw)]
                              + f02 * r0[np.uint64(o + d2)] + f10 * r1[np.uint64(o)]
                              + f11 * r1[np.uint64(o + dw)] + f12 * r1[np.uint64(o + d2)]
                              + f20 * r2[np.uint64(o)] + f21 * r2[np.uint64(o + dw)]
                              + f22 * r2[np.uint64(o + d2)])


def _direct_forward(x, w, bias, sh, sw, pt, pl, pb, pr, dh, dw, y):
    """y[n, k, a, b] = bias[k] + sum_{c, i, j} w[k, c, i, j]
    xpad[n, g0 + c, a sh + i dh, b sw + j dw], g0 the first channel of k's group; one
    (image, group) per thread, its planes padded once for all the group's outputs."""
    N, C, H, W = x.shape
    K, Cg, kh, kw = w.shape
    G = C // Cg
    Kg = K // G
    Ho, Wo = y.shape[2], y.shape[3]
    for ng in numba.prange(N * G):
        n = ng // G
        g = ng % G
        P = np.empty((Cg, H + pt + pb, W + pl + pr), dtype=x.dtype)
        _pad_planes(x, n, g * Cg, (g + 1) * Cg, pt, pl, P)
        for k in range(g * Kg, (g + 1) * Kg):
            for a in range(Ho):
                out = y[n, k, a]
                for b in range(Wo):
                    out[np.uint64(b)] = bias[k]
                if kh == 3 and kw == 3:
                    for c in range(Cg):
                        _row_taps3x3(out, P[c], w[k, c], a * sh, dh, dw, sw)
                    continue
                for c in range(Cg):
                    for i in range(kh):
                        row = P[c, a * sh + i * dh]
                        for j in range(kw):
                            f = w[k, c, i, j]
                            o = j * dw
                            if sw == 1:
                                for b in range(Wo):
                                    out[np.uint64(b)] += f * row[np.uint64(o + b)]
                            else:
                                for b in range(Wo):
                                    out[np.uint64(b)] += f * row[np.uint64(o + b * sw)]


def _direct_backward_input(dy, w, sh, sw, pt, pl, pb, pr, dh, dw, dx):
    """dx = the adjoint of ``_direct_forward`` in x: dy[n, k, a, b] w[k, c, i, j] added at
    xpad[n, g0 + c, a sh + i dh, b sw + j dw], the padding cropped; one (n, c) per thread."""
    N, C, H, W = dx.shape
    K, Cg, kh, kw = w.shape
    Kg = K // (C // Cg)
    Ho, Wo = dy.shape[2], dy.shape[3]
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        g = c // Cg
        P = np.zeros((H + pt + pb, W + pl + pr), dtype=dx.dtype)
        for k in range(g * Kg, (g + 1) * Kg):
            for a in range(Ho):
                gy = dy[n, k, a]
                for i in range(kh):
                    row = P[a * sh + i * dh]
                    for j in range(kw):
                        f = w[k, c - g * Cg, i, j]
                        o = j * dw
                        if sw == 1:
                            for b in range(Wo):
                                row[np.uint64(o + b)] += f * gy[np.uint64(b)]
                        else:
                            for b in range(Wo):
                                row[np.uint64(o + b * sw)] += f * gy[np.uint64(b)]
        for h in range(H):
            src = P[pt + h]
            dst = dx[n, c, h]
            for v in range(W):
                dst[np.uint64(v)] = src[np.uint64(pl + v)]


def _direct_backward_weight(x, dy, sh, sw, pt, pl, pb, pr, dh, dw, dw_out, dbias):
    """dw_out[k, c, i, j] = sum_{n, a, b} dy[n, k, a, b] xpad[n, g0 + c, a sh + i dh,
    b sw + j dw] and dbias[k] = sum_{n, a, b} dy[n, k, a, b]; one output channel per thread."""
    N, C, H, W = x.shape
    K, Cg, kh, kw = dw_out.shape
    Kg = K // (C // Cg)
    Ho, Wo = dy.shape[2], dy.shape[3]
    for k in numba.prange(K):
        g0 = (k // Kg) * Cg
        P = np.empty((Cg, H + pt + pb, W + pl + pr), dtype=x.dtype)
        acc = np.zeros((Cg, kh, kw, Wo), dtype=x.dtype)
        accb = np.zeros(Wo, dtype=x.dtype)
        for n in range(N):
            _pad_planes(x, n, g0, g0 + Cg, pt, pl, P)
            for a in range(Ho):
                gy = dy[n, k, a]
                for b in range(Wo):
                    accb[np.uint64(b)] += gy[np.uint64(b)]
                for c in range(Cg):
                    for i in range(kh):
                        row = P[c, a * sh + i * dh]
                        for j in range(kw):
                            s = acc[c, i, j]
                            o = j * dw
                            if sw == 1:
                                for b in range(Wo):
                                    s[np.uint64(b)] += gy[np.uint64(b)] * row[np.uint64(o + b)]
                            else:
                                for b in range(Wo):
                                    s[np.uint64(b)] += (gy[np.uint64(b)]
                                                        * row[np.uint64(o + b * sw)])
        for c in range(Cg):
            for i in range(kh):
                for j in range(kw):
                    t = 0.0
                    for b in range(Wo):
                        t += acc[c, i, j, b]
                    dw_out[k, c, i, j] = t
        t = 0.0
        for b in range(Wo):
            t += accb[b]
        dbias[k] = t


def _direct_backward_bias(dy, dbias):
    """dbias[k] = sum_{n, a, b} dy[n, k, a, b], summed as ``direct_backward_weight`` sums it
    (each output column over n and a, then the columns): the bias gradient alone."""
    N, K, Ho, Wo = dy.shape
    for k in numba.prange(K):
        accb = np.zeros(Wo, dtype=dy.dtype)
        for n in range(N):
            for a in range(Ho):
                gy = dy[n, k, a]
                for b in range(Wo):
                    accb[np.uint64(b)] += gy[np.uint64(b)]
        t = 0.0
        for b in range(Wo):
            t += accb[b]
        dbias[k] = t


direct_forward = _by_size(_direct_forward, -1)  # y
direct_backward_input = _by_size(_direct_backward_input, -1)  # dx
direct_backward_weight = _by_size(_direct_backward_weight, 0)  # x
direct_backward_bias = _by_size(_direct_backward_bias, 0)  # dy
