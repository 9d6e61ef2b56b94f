"""Winograd F(4x4, 3x3) tile transforms on the CPU (Numba), around numpy's batched GEMM.

Lavin and Gray's minimal filtering algorithm: a 4x4 output tile of a 3x3 cross-correlation
is ``A^T [(G g G^T) * (B^T d B)] A`` with d the 6x6 input tile (tiles overlap by 2), so the
36 elementwise products, summed over channels, are 36 GEMMs with a quarter of im2col's
multiplies (``nnkit.kernels.conv.cpu_winograd`` runs them). The kernels here, one (n, c)
plane per ``prange`` iteration (no two threads write one element: deterministic):

- ``wino_input``: V[e1 6 + e2, c, t] = (B^T d B)[e1, e2] for the tiles t of x padded by
  (pt, pl), t = n S + ta (TW + 1) + tb, S = TH (TW + 1): each tile row ends with a junk
  tile (tb = TW) kept zero, so that every tap of every tile of a plane is one contiguous run
  of S values in the phase layout below;
- ``wino_output``: y = bias + A^T m A for the tiles m of M (36, K, T), clipped at the edge;
- ``wino_output_adjoint``: dM = A g A^T for the 4x4 tiles g of dy (the junk tiles zero);
- ``wino_input_adjoint``: dx = the sum of B v B^T over the (overlapping) input windows.

Phase layout: a padded plane is stored as D[((p 4 + r)(TH + 1) + ta) Q + q] =
xpad[4 ta + p, 4 q + r] (Q = TW + 1), so tap (i, j) of all tiles is the run starting at
((i % 4) 4 + j % 4)(TH + 1) + i // 4) Q + j // 4. Each 2-D transform is then two 1-D passes
of unit-stride loops over S tiles that LLVM vectorises; only the (de)interleave between a
plane and its phase layout is strided (a gather or scatter per element). No fastmath: the
sums keep their order. Kernels validate nothing; arrays C-contiguous, outputs preallocated.
"""

from __future__ import annotations

import numba
import numpy as np

from ._dispatch import serial_or_parallel

__all__ = ["BT", "G", "AT", "wino_input", "wino_output", "wino_output_adjoint",
           "wino_input_adjoint"]

# F(4x4, 3x3) with the points 0, +-1, +-2, inf (Lavin and Gray, 2016)
BT = np.array([[4, 0, -5, 0, 1, 0],
               [0, -4, -4, 1, 1, 0],
               [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0],
               [0, 2, -1, -2, 1, 0],
               [0, 4, 0, -5, 0, 1]], dtype=np.float64)
G = np.array([[1 / 4, 0, 0],
              [-1 / 6, -1 / 6, -1 / 6],
              [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6],
              [1 / 24, -1 / 12, 1 / 6],
              [0, 0, 1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 1, 1, 0],
               [0, 1, -1, 2, -2, 0],
               [0, 1, 1, 4, 4, 0],
               [0, 1, -1, 8, -8, 1]], dtype=np.float64)


@numba.njit(cache=True, inline="always")
def _zero(dst, d0, n):
    """dst[d0:d0 + n] = 0."""
    du = np.uint64(d0)
    for t in range(n):
        dst[du + np.uint64(t)] = 0


# ---- the F(4x4, 3x3) transforms ------------------------------------------------------------
# Each 2-D transform is two 1-D passes over runs of S = TH (TW + 1) tiles (one plane). A 1-D
# pass computes each output row in its own loop with only the nonzero taps of its matrix row
# (B^T has 22 of 36, A^T 18 of 24): a loop writing several rows of dst needs more run-time
# alias checks against src than LLVM allows (8) and would stay scalar.


@numba.njit(cache=True, inline="always")
def _row(src, s0, s1, s2, s3, s4, s5, c0, c1, c2, c3, c4, c5, k, dst, d, n, add):
    """dst[d + t] (+)= sum_{q < k} c_q src[s_q + t] for t < n (unsigned indices and one
    loop per term count: LLVM vectorises each)."""
    u0, u1, u2 = np.uint64(s0), np.uint64(s1), np.uint64(s2)
    u3, u4, u5 = np.uint64(s3), np.uint64(s4), np.uint64(s5)
    du = np.uint64(d)
    if k == 1:
        for t in range(n):
            i = np.uint64(t)
            v = c0 * src[u0 + i]
            if add:
                dst[du + i] += v
            else:
                dst[du + i] = v
    elif k == 2:
        for t in range(n):
            i = np.uint64(t)
            v = c0 * src[u0 + i] + c1 * src[u1 + i]
            if add:
                dst[du + i] += v
            else:
                dst[du + i] = v
    elif k == 3:
        for t in range(n):
            i = np.uint64(t)
            v = c0 * src[u0 + i] + c1 * src[u1 + i] + c2 * src[u2 + i]
            if add:
                dst[du + i] += v
            else:
                dst[du + i] = v
    elif k == 4:
        for t in range(n):
            i = np.uint64(t)
            v = c0 * src[u0 + i] + c1 * src[u1 + i] + c2 * src[u2 + i] + c3 * src[u3 + i]
            if add:
                dst[du + i] += v
            else:
                dst[du + i] = v
    elif k == 5:
        for t in range(n):
            i = np.uint64(t)
            v = (c0 * src[u0 + i] + c1 * src[u1 + i] + c2 * src[u2 + i] + c3 * src[u3 + i]
                 + c4 * src[u4 + i])
            if add:
                dst[du + i] += v
            else:
                dst[du + i] = v
    elif k == 6:
        for t in range(n):
            i = np.uint64(t)
            v = (c0 * src[u0 + i] + c1 * src[u1 + i] + c2 * src[u2 + i] + c3 * src[u3 + i]
                 + c4 * src[u4 + i] + c5 * src[u5 + i])
            if add:
                dst[du + i] += v
            else:
                dst[du + i] = v


@numba.njit(cache=True, inline="always")
def _apply(L, src, so, dst, do, n, add):
    """dst[do[e] + t] (+)= sum_i L[e, i] src[so[i] + t] for the rows e of L, a packed matrix
    (``_packed``): L[e, 0, :] the row's nonzero coefficients, L[e, 1, :] their columns
    (as floats), L[e, 2, 0] their count."""
    for e in range(L.shape[0]):
        k = int(L[e, 2, 0])
        c = L[e, 0]
        j = L[e, 1]
        _row(src, so[int(j[0])], so[int(j[1])], so[int(j[2])], so[int(j[3])], so[int(j[4])],
             so[int(j[5])], c[0], c[1], c[2], c[3], c[4], c[5], k, dst, do[e], n, add)


@numba.njit(cache=True, inline="always")
def _phase(i, j, TH, Q):
    """Offset of tap (i, j) of tile (0, 0) in the phase layout (see _tile_transform)."""
    return (((i % 4) * 4 + j % 4) * (TH + 1) + i // 4) * Q + j // 4


@numba.njit(cache=True, inline="always")
def _deinterleave(xf, p0, H, W, pt, pl, TH, Q, D):
    """D (phase layout) = the plane at xf[p0:] padded by (pt, pl), zero outside."""
    for hp in range(4 * (TH + 1)):
        h = hp - pt
        for r in range(4):
            d0 = (((hp % 4) * 4 + r) * (TH + 1) + hp // 4) * Q
            if h < 0 or h >= H:
                _zero(D, d0, Q)
                continue
            w0 = r - pl
            lo = 0 if w0 >= 0 else min(Q, (-w0 + 3) // 4)
            hi = max(lo, 0 if W - 1 - w0 < 0 else min(Q, (W - 1 - w0) // 4 + 1))
            _zero(D, d0, lo)
            src = np.uint64(p0 + h * W + w0)
            for q in range(lo, hi):
                D[np.uint64(d0 + q)] = xf[src + np.uint64(4 * q)]
            _zero(D, d0 + hi, Q - hi)
    _zero(D, 16 * (TH + 1) * Q, Q + 1)


@numba.njit(cache=True, inline="always")
def _interleave(D, H, W, pt, pl, TH, Q, bias, yf, p0):
    """yf[p0 + h W + w] = D at the padded position (h + pt, w + pl), + bias."""
    for h in range(H):
        hp = h + pt
        for r in range(4):
            w0 = r - pl
            lo = 0 if w0 >= 0 else (-w0 + 3) // 4
            hi = max(lo, 0 if W - 1 - w0 < 0 else min(Q, (W - 1 - w0) // 4 + 1))
            du = np.uint64((((hp % 4) * 4 + r) * (TH + 1) + hp // 4) * Q)
            dst = np.uint64(p0 + h * W + w0)
            for q in range(lo, hi):
                yf[dst + np.uint64(4 * q)] = D[du + np.uint64(q)] + bias


def _wino_input(x, L, pt, pl, TH, TW, V):
    """V (36, C, N S) = B^T d B for every 6x6 input tile d of x (N, C, H, W) padded by
    (pt, pl); S = TH (TW + 1), tile (ta, tb) of image n at n S + ta (TW + 1) + tb, the
    column tb = TW of each tile row zero."""
    N, C, H, W = x.shape
    Q = TW + 1
    S = TH * Q
    T = N * S
    xf = x.reshape(-1)
    vf = V.reshape(-1)
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        D = np.empty(16 * (TH + 1) * Q + Q + 1, dtype=x.dtype)
        _deinterleave(xf, (n * C + c) * H * W, H, W, pt, pl, TH, Q, D)
        t1 = np.empty(36 * S, dtype=x.dtype)  # t1[e1 6 + j] = sum_i B^T[e1, i] d[i, j]
        for j in range(6):
            _apply(L, D, (_phase(0, j, TH, Q), _phase(1, j, TH, Q), _phase(2, j, TH, Q),
                    _phase(3, j, TH, Q), _phase(4, j, TH, Q), _phase(5, j, TH, Q)),
                t1, (j * S, (6 + j) * S, (12 + j) * S, (18 + j) * S, (24 + j) * S,
                     (30 + j) * S), S, False)
        for e1 in range(6):
            o = (e1 * 6 * C + c) * T + n * S
            st = C * T
            _apply(L, t1, (e1 * 6 * S, (e1 * 6 + 1) * S, (e1 * 6 + 2) * S, (e1 * 6 + 3) * S,
                     (e1 * 6 + 4) * S, (e1 * 6 + 5) * S),
                vf, (o, o + st, o + 2 * st, o + 3 * st, o + 4 * st, o + 5 * st), S, False)
            for e2 in range(6):
                for ta in range(TH):
                    vf[np.uint64(o + e2 * st + ta * Q + TW)] = 0


def _wino_output(M, L, TH, TW, bias, y):
    """y (N, K, Ho, Wo) = bias + A^T m A for every tile m of M (36, K, N S)."""
    N, K, H, W = y.shape
    Q = TW + 1
    S = TH * Q
    T = N * S
    mf = M.reshape(-1)
    yf = y.reshape(-1)
    for nk in numba.prange(N * K):
        n = nk // K
        k = nk % K
        s1 = np.empty(24 * S, dtype=y.dtype)  # s1[e1 4 + v] = sum_e2 m[e1, e2] A[e2, v]
        st = K * T
        for e1 in range(6):
            o = (e1 * 6 * K + k) * T + n * S
            _apply(L, mf, (o, o + st, o + 2 * st, o + 3 * st, o + 4 * st, o + 5 * st),
                s1, (e1 * 4 * S, (e1 * 4 + 1) * S, (e1 * 4 + 2) * S, (e1 * 4 + 3) * S), S, False)
        D = np.empty(16 * (TH + 1) * Q + Q + 1, dtype=y.dtype)
        for v in range(4):
            _apply(L, s1, (v * S, (4 + v) * S, (8 + v) * S, (12 + v) * S, (16 + v) * S,
                     (20 + v) * S),
                D, (_phase(0, v, TH, Q), _phase(1, v, TH, Q), _phase(2, v, TH, Q),
                    _phase(3, v, TH, Q)), S, False)
        _interleave(D, H, W, 0, 0, TH, Q, bias[k], yf, (n * K + k) * H * W)


def _wino_output_adjoint(dy, L, TH, TW, dM):
    """dM (36, K, N S) = A g A^T for every 4x4 tile g of dy (N, K, Ho, Wo) (zero beyond
    its edge; the junk column zero): the adjoint of ``_wino_output``'s transform."""
    N, K, H, W = dy.shape
    Q = TW + 1
    S = TH * Q
    T = N * S
    gf = dy.reshape(-1)
    mf = dM.reshape(-1)
    for nk in numba.prange(N * K):
        n = nk // K
        k = nk % K
        D = np.empty(16 * (TH + 1) * Q + Q + 1, dtype=dy.dtype)
        _deinterleave(gf, (n * K + k) * H * W, H, W, 0, 0, TH, Q, D)
        for ta in range(TH + 1):  # the junk column: zero in D, so zero in dM
            for p in range(16):
                D[np.uint64((p * (TH + 1) + ta) * Q + TW)] = 0
        t1 = np.empty(24 * S, dtype=dy.dtype)  # t1[e1 4 + v] = sum_u A[e1, u] g[u, v]
        for v in range(4):
            _apply(L, D, (_phase(0, v, TH, Q), _phase(1, v, TH, Q), _phase(2, v, TH, Q),
                   _phase(3, v, TH, Q)),
               t1, (v * S, (4 + v) * S, (8 + v) * S, (12 + v) * S, (16 + v) * S,
                    (20 + v) * S), S, False)
        st = K * T
        for e1 in range(6):
            o = (e1 * 6 * K + k) * T + n * S
            _apply(L, t1, (e1 * 4 * S, (e1 * 4 + 1) * S, (e1 * 4 + 2) * S, (e1 * 4 + 3) * S),
               mf, (o, o + st, o + 2 * st, o + 3 * st, o + 4 * st, o + 5 * st), S, False)


def _wino_input_adjoint(dV, L, pt, pl, TH, TW, dx):
    """dx (N, C, H, W) = the sum over tiles of B v B^T placed at the tile's input window
    (overlapping windows add), for the tiles v of dV (36, C, N S): ``_wino_input``'s adjoint."""
    N, C, H, W = dx.shape
    Q = TW + 1
    S = TH * Q
    T = N * S
    vf = dV.reshape(-1)
    xf = dx.reshape(-1)
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        s1 = np.empty(36 * S, dtype=dx.dtype)  # s1[e1 6 + j] = sum_e2 v[e1, e2] B^T[e2, j]
        st = C * T
        for e1 in range(6):
            o = (e1 * 6 * C + c) * T + n * S
            _apply(L, vf, (o, o + st, o + 2 * st, o + 3 * st, o + 4 * st, o + 5 * st),
               s1, (e1 * 6 * S, (e1 * 6 + 1) * S, (e1 * 6 + 2) * S, (e1 * 6 + 3) * S,
                    (e1 * 6 + 4) * S, (e1 * 6 + 5) * S), S, False)
        D = np.zeros(16 * (TH + 1) * Q + Q + 1, dtype=dx.dtype)
        for j in range(6):
            # rows i = 0..3 and 4..5 of the tiles overlap the next tile row: added, in
            # separate passes over distinct elements
            _apply(L, s1, (j * S, (6 + j) * S, (12 + j) * S, (18 + j) * S, (24 + j) * S,
                    (30 + j) * S),
               D, (_phase(0, j, TH, Q), _phase(1, j, TH, Q), _phase(2, j, TH, Q),
                   _phase(3, j, TH, Q), _phase(4, j, TH, Q), _phase(5, j, TH, Q)), S, True)
        _interleave(D, H, W, pt, pl, TH, Q, np.zeros(1, dtype=dx.dtype)[0], xf,
                    (n * C + c) * H * W)


# nogil: ``nnkit.kernels.conv.cpu_winograd`` runs the serial builds from one Python thread per
# run of images
_builds = {f.__name__.lstrip("_"): serial_or_parallel(f, nogil=True) for f in
           (_wino_input, _wino_output, _wino_output_adjoint, _wino_input_adjoint)}


_MATRICES = {}


def _packed(m, dtype):
    """The matrix m (rows of at most 6 entries) for ``_apply``: per row its nonzero
    coefficients, their column indices and their count, as an (rows, 3, 6) array of dtype
    (the kernels multiply in the array's precision); unused slots weigh 0 at column 0."""
    out = np.zeros((m.shape[0], 3, 6), dtype=dtype)
    for e, row in enumerate(m):
        cols = np.flatnonzero(row)
        out[e, 0, :cols.size] = row[cols]
        out[e, 1, :cols.size] = cols
        out[e, 2, 0] = cols.size
    return out


def _matrix(name, dtype):
    """B^T, B, A^T or A packed for ``_apply`` in ``dtype``."""
    key = (name, np.dtype(dtype))
    if key not in _MATRICES:
        _MATRICES[key] = _packed({"BT": BT, "B": BT.T, "AT": AT, "A": AT.T}[name], dtype)
    return _MATRICES[key]


def _launch(name, parallel, *args):
    build = _builds[name]
    (build.parallel if parallel else build.serial)(*args)


def wino_input(x, pt, pl, TH, TW, V, parallel=False):
    """``_wino_input`` (serial unless ``parallel``)."""
    _launch("wino_input", parallel, x, _matrix("BT", x.dtype), pt, pl, TH, TW, V)


def wino_output(M, TH, TW, bias, y, parallel=False):
    """``_wino_output``; bias (K,), zeros for none."""
    _launch("wino_output", parallel, M, _matrix("AT", M.dtype), TH, TW, bias, y)


def wino_output_adjoint(dy, TH, TW, dM, parallel=False):
    """``_wino_output_adjoint``."""
    _launch("wino_output_adjoint", parallel, dy, _matrix("A", dy.dtype), TH, TW, dM)


def wino_input_adjoint(dV, pt, pl, TH, TW, dx, parallel=False):
    """``_wino_input_adjoint``."""
    _launch("wino_input_adjoint", parallel, dV, _matrix("B", dV.dtype), pt, pl, TH, TW, dx)
