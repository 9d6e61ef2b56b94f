"""The CPU convolution's ``winograd`` path: F(4x4, 3x3) for 3x3 stride-1 undilated layers.

y = A^T [U * V] A tile by tile (``nnkit._ext.winograd_cpu``), U = G g G^T (36, K, C) and
V = B^T d B (36, C, T) for the T tiles (4x4 outputs, 6x6 inputs, one junk tile ending each
tile row); the 36 products summed over channels are the batched GEMM M = U @ V (36, K, T),
a quarter of im2col's multiplies. The backward runs the exact adjoints of these linear maps:
dM = A dY A^T (36, K, T), then

    dU = dM @ V^T (36, K, C) and dW = G^T dU G;   dV = U^T @ dM and dx = B dV B^T

added over the overlapping input windows. The transforms' constants (1/24 .. 8) scale
intermediate values by up to ~100, so the float32 error is some 10-100 times im2col's (the
bound tested, ``test_winograd_float32_error_bound``: 2^-13 of max|exact|; the errors
measured: benchmarks/RESULTS.md, "Convolution algorithms by shape").

As the per-image paths, the batch runs as one run of images per numba thread: each thread
transforms its images, runs its batched GEMM on one BLAS thread and transforms back, so the
serial transforms use every core. The forward keeps each run's V (in ``cache.cols``) for
the backward, which overwrites it by dV.
"""

from __future__ import annotations

import numpy as np

from ..._ext import winograd_cpu
from .cpu_threads import image_chunks, over_images, pool

__all__ = ["forward", "backward"]


def _tiles(cache):
    """(TH, TW, S): tile rows and columns of one image and its tile count with junk tiles."""
    Ho, Wo = cache.out_hw
    TH, TW = -(-Ho // 4), -(-Wo // 4)
    return TH, TW, TH * (TW + 1)


def _kron_g(dtype):
    """G (x) G (36, 9): (G w G^T)[e1, e2] = sum_{i, j} G[e1, i] G[e2, j] w[i, j] as a matrix."""
    G = winograd_cpu.G
    return np.kron(G, G).astype(dtype)


def _weight_transform(weight):
    """U[e1 6 + e2, k, c] = (G w[k, c] G^T)[e1, e2]: one GEMM (36, 9) @ (9, K C)."""
    K, C = weight.shape[:2]
    w = np.ascontiguousarray(weight).reshape(K * C, 9)
    return np.matmul(_kron_g(weight.dtype), w.T).reshape(36, K, C)


def _input_transform(cache, lo, hi):
    """V (36, C, (hi - lo) S) of images [lo, hi) (the serial, GIL-free build)."""
    x = cache.x
    TH, TW, S = _tiles(cache)
    V = pool.take(36 * x.shape[1] * (hi - lo) * S, x.dtype).reshape(36, x.shape[1], -1)
    winograd_cpu.wino_input(x[lo:hi], cache.pads[0][0], cache.pads[1][0], TH, TW, V)
    return V


def forward(x, weight, bias, cache):
    """y = A^T [U V] A per run of images; U in ``cache.wino_u``, the runs' V in
    ``cache.cols`` and the runs in ``cache.wino_chunks``."""
    x = cache.x = np.ascontiguousarray(x)
    N, K = x.shape[0], weight.shape[0]
    TH, TW, S = _tiles(cache)
    U = cache.wino_u = _weight_transform(weight)
    y = np.empty((N, K, *cache.out_hw), dtype=x.dtype)
    b = np.ascontiguousarray(bias if bias is not None else np.zeros(K, dtype=x.dtype))
    cache.wino_chunks = image_chunks(N)

    def run(lo, hi):
        V = _input_transform(cache, lo, hi)
        M = pool.take(36 * K * (hi - lo) * S, x.dtype).reshape(36, K, -1)
        np.matmul(U, V, out=M)
        winograd_cpu.wino_output(M, TH, TW, b, y[lo:hi])
        pool.give(M)
        return V

    cache.cols = over_images(run, cache.wino_chunks)
    return y


def backward(dy, cache, needs):
    """dx = B (U^T dM) B^T and dW = G^T (dM V^T) G, dM = A dY A^T, per run of images; dbias
    the sums of dy. V is recomputed where an earlier backward consumed it."""
    need_x, need_w, need_b = needs
    dy = np.ascontiguousarray(dy)
    dx = dweight = dbias = None
    if need_x or need_w:
        dx, dweight = _backward_runs(dy, cache, need_x, need_w)
    if need_b:
        dbias = dy.sum(axis=(0, 2, 3), dtype=np.float64).astype(dy.dtype)
    return dx, dweight, dbias


def _backward_runs(dy, cache, need_x, need_w):
    """(dx or None, dweight or None): the transforms' adjoints around two batched GEMMs per
    run of images; the runs' V is kept for a later backward when only dW was wanted."""
    x, weight = cache.x, cache.weight
    C, K = x.shape[1], weight.shape[0]
    TH, TW, S = _tiles(cache)
    dx = np.empty(x.shape, dtype=x.dtype) if need_x else None
    chunks = cache.wino_chunks
    cols = cache.cols if cache.cols is not None else [None] * len(chunks)
    cache.cols = None  # overwritten by dV below, or kept (weight gradient only)
    kept = [None] * len(chunks)

    def run(i):
        lo, hi = chunks[i]
        dM = pool.take(36 * K * (hi - lo) * S, x.dtype).reshape(36, K, -1)
        winograd_cpu.wino_output_adjoint(dy[lo:hi], TH, TW, dM)
        dU = None
        V = cols[i]
        if need_w:
            V = V if V is not None else _input_transform(cache, lo, hi)
            dU = np.matmul(dM, V.transpose(0, 2, 1))  # (36, K, C)
        if need_x:
            dV = V if V is not None else pool.take(36 * C * (hi - lo) * S, x.dtype)
            dV = dV.reshape(36, C, -1)
            np.matmul(cache.wino_u.transpose(0, 2, 1), dM, out=dV)
            winograd_cpu.wino_input_adjoint(dV, cache.pads[0][0], cache.pads[1][0], TH, TW,
                                            dx[lo:hi])
            pool.give(dV)
        else:
            kept[i] = V
        pool.give(dM)
        return dU

    parts = over_images(lambda lo, hi: run(chunks.index((lo, hi))), chunks)
    if not need_x:
        cache.cols = kept
    dweight = None
    if need_w:
        dU = parts[0]
        for part in parts[1:]:
            dU += part
        # dW[k, c] = G^T dU[., k, c] G: (K C, 36) @ (36, 9)
        dweight = np.matmul(dU.reshape(36, K * C).T, _kron_g(x.dtype)).reshape(weight.shape)
    return dx, dweight
