"""Implicit-GEMM convolution on the packed C GEMM of ``gemm_packed.h`` (CPU, Numba).

An ungrouped convolution of one image is the GEMM y[n] (K, Ho Wo) = W (K, C kh kw) @ cols,
cols the image's im2col matrix. Here cols is never built: the image is copied once into
zero-padded planes, and each block of output pixels gets its right-hand panels
(``gemm_cpu.pack_panels``'s layout: NR = 32 float32 or 16 float64 pixels a panel, one row
per (c, i, j) tap) gathered from them, then the block's product runs in the C kernel
(``gemm_cpu.step_gemm``: 4-row x NR-column register tiles, the panel in L1/L2).
The block's panels stay in cache between the gather and the GEMM, and the GEMM keeps its
accumulators in registers where OpenBLAS SGEMM at K = 16-64 output rows packs both
operands again at every call.

Kernels validate nothing: x (N, C, H, W) and y (N, K, Ho Wo) C-contiguous of one float
dtype, w (K, C kh kw) C-contiguous; they run images [lo, hi) serially and release the GIL
(one run of images per Python thread).
"""

from __future__ import annotations

import numba
import numpy as np

from .gemm_cpu import PANEL_WIDTH, step_gemm

__all__ = ["forward"]

_NR_F32, _NR_F64 = PANEL_WIDTH["float32"], PANEL_WIDTH["float64"]


@numba.njit(cache=True, inline="always")
def _pad_image(xf, base, C, H, W, pt, pl, Hp, Wp, xp):
    """xp (C Hp Wp,) = the image at flat offset ``base`` of xf placed at (pt, pl) in zeros."""
    xp[:] = 0
    for c in range(C):
        for h in range(H):
            src = np.uint64(base + (c * H + h) * W)
            dst = np.uint64((c * Hp + pt + h) * Wp + pl)
            for t in range(W):
                xp[dst + np.uint64(t)] = xf[src + np.uint64(t)]


@numba.njit(cache=True, inline="always")
def _gather(xp, C, Hp, Wp, kh, kw, sh, sw, dh, dw, Wo, q0, width, pf, NR):
    """pf (R NR,): the panel (R, NR) of the im2col columns of output pixels [q0, q0 + width)
    from the padded planes xp (C, Hp, Wp), flat; columns beyond ``width`` zero. NR: the
    panel width, a compile-time constant as the caller spells it out (a whole panel row is
    then a fixed-size copy)."""
    R = C * kh * kw
    if width < NR:
        for r in range(R):
            for t in range(width, NR):
                pf[np.uint64(r * NR + t)] = 0
    q = 0
    while q < width:
        pix = q0 + q
        oh = pix // Wo
        ow = pix - oh * Wo
        seg = min(width - q, Wo - ow)
        for c in range(C):
            for i in range(kh):
                for j in range(kw):
                    dst = np.uint64(((c * kh + i) * kw + j) * NR + q)
                    src = np.uint64((c * Hp + oh * sh + i * dh) * Wp + ow * sw + j * dw)
                    if sw != 1:
                        for t in range(seg):
                            pf[dst + np.uint64(t)] = xp[src + np.uint64(t * sw)]
                    elif seg == NR:
                        for t in range(NR):
                            pf[dst + np.uint64(t)] = xp[src + np.uint64(t)]
                    else:
                        for t in range(seg):
                            pf[dst + np.uint64(t)] = xp[src + np.uint64(t)]
        q += seg


def _forward(x, w, bias, has_bias, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, lo, hi,
             block_bytes, y):
    """y[n] (K, Ho Wo) = w (K, C kh kw) @ cols(x[n]) (+ bias) for n in [lo, hi); the
    padding above and left (pt, pl) >= 0, below and right whatever the window needs.
    block_bytes: the gathered panels per block of output pixels (whole panels, at least
    one), to be multiplied while they sit in the core's L2."""
    N, C, H, W = x.shape
    K, R = w.shape
    P = Ho * Wo
    nr = _NR_F32 if x.itemsize == 4 else _NR_F64
    per_block = max(1, block_bytes // (R * nr * x.itemsize))
    n_panels = (P + nr - 1) // nr
    if per_block >= n_panels:
        per_block = n_panels
    Hp = max(H + pt, (Ho - 1) * sh + (kh - 1) * dh + 1)
    Wp = max(W + pl, (Wo - 1) * sw + (kw - 1) * dw + 1)
    xp = np.empty(C * Hp * Wp, dtype=x.dtype)
    panels = np.empty((per_block, R, nr), dtype=x.dtype)
    pflat = panels.reshape(-1)
    block = np.empty(K * per_block * nr, dtype=x.dtype)
    xf = x.reshape(-1)
    for n in range(lo, hi):
        _pad_image(xf, n * C * H * W, C, H, W, pt, pl, Hp, Wp, xp)
        yn = y[n]
        for p0 in range(0, n_panels, per_block):
            p1 = min(n_panels, p0 + per_block)
            q0 = p0 * nr
            q1 = min(P, p1 * nr)
            for p in range(p0, p1):
                pf = pflat[(p - p0) * R * nr:(p - p0 + 1) * R * nr]
                if x.itemsize == 4:
                    _gather(xp, C, Hp, Wp, kh, kw, sh, sw, dh, dw, Wo, p * nr,
                            min(nr, P - p * nr), pf, _NR_F32)
                else:
                    _gather(xp, C, Hp, Wp, kh, kw, sh, sw, dh, dw, Wo, p * nr,
                            min(nr, P - p * nr), pf, _NR_F64)
            if q0 == 0 and q1 == P:  # the whole image in one block: write y[n] directly
                step_gemm(w, panels, yn)
            else:
                out = block[:K * (q1 - q0)].reshape(K, q1 - q0)  # contiguous, as the C
                step_gemm(w, panels, out)  # kernel's row stride is its width
                for k in range(K):
                    yn[k, q0:q1] = out[k]
        if has_bias:
            for k in range(K):
                yn[k] += bias[k]


forward = numba.njit(cache=True, nogil=True, error_model="numpy")(_forward)
