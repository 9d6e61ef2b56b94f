"""CPU convolution paths that run image by image: ``pointwise`` (1x1), ``image`` (im2col +
GEMM per image) and ``packed`` (an implicit GEMM on the packed C kernel).

Each runs the batch as one run of images per numba thread (``cpu_threads.over_images``).
Forwards take ``(x, weight, bias, cache)`` and return y; backwards take ``(dy, cache,
needs)`` with ``needs`` = (x, weight, bias) wanted, and return (dx, dweight, dbias), None
where not wanted.

- ``pointwise``: y[n] = W (K, C) @ x[n] (C, H W), numpy's GEMM writing NCHW, on x itself.
- ``image``: the cols of one image (C kh kw, Ho Wo) stay in the L2 cache between im2col and
  the GEMM, and the GEMM writes the image's output in NCHW: no batch-wide cols (tens of MiB
  written and read back) and no output transpose. The backward recomputes each image's cols
  for dW^T += cols @ dY[n]^T and runs col2im on W^T dY[n] into dx[n]; dy is read in place.
- ``packed``: the GEMM y[n] = W @ cols(x[n]) with cols never built: ``nnkit._ext.
  conv_packed_cpu`` gathers each block of output pixels' panels from the zero-padded image
  straight into the layout of the packed C GEMM (``gemm_packed.h``, 4-row register tiles)
  and multiplies them while they sit in L2; one Numba call (GIL released) per run of images.
  Its backward is ``image``'s.
"""

from __future__ import annotations

import numpy as np

from ..._ext import conv_cpu, conv_packed_cpu
from .cpu_threads import image_chunks, over_images, summed

__all__ = ["pointwise_forward", "pointwise_backward", "image_forward", "image_backward",
           "packed_forward", "PACKED_BLOCK_BYTES"]

# Bytes of gathered panels per block of output pixels: a block larger than L2 (1-2 MiB a
# core) would be written out to L3 by the gather and read back by the GEMM; 1 MiB was the
# best block size measured (benchmarks/RESULTS.md, "Convolution: implicit GEMM on the
# packed C kernel").
PACKED_BLOCK_BYTES = 1 << 20


def _bias_sum(dyr):
    """The bias gradient's part of a run of images, dyr (n, K, P): pairwise per plane, then
    over the images in float64, on the run's own thread (a float64 sum of the whole dy on
    one thread took a large share of the backward)."""
    return dyr.sum(axis=2).sum(axis=0, dtype=np.float64)


def pointwise_forward(x, weight, bias, cache):
    """y[n] = W (K, C) @ x[n] (C, H W) for each image n: numpy's batched GEMM writes NCHW."""
    N, C, H, W = x.shape
    K = weight.shape[0]
    w = np.ascontiguousarray(weight).reshape(K, C)
    xr = x.reshape(N, C, H * W)
    y = np.empty((N, K, H * W), dtype=x.dtype)

    def run(lo, hi):
        np.matmul(w, xr[lo:hi], out=y[lo:hi])
        if bias is not None:
            y[lo:hi] += bias.reshape(1, K, 1)

    over_images(run, image_chunks(N))
    return y.reshape(N, K, H, W)


def pointwise_backward(dy, cache, needs):
    """dx[n] = W^T @ dy[n]; dW = sum_n dy[n] @ x[n]^T (per run of images, then summed)."""
    need_x, need_w, need_b = needs
    x, weight = cache.x, cache.weight
    N, C, H, W = x.shape
    K = weight.shape[0]
    w = np.ascontiguousarray(weight).reshape(K, C)
    dyr = np.ascontiguousarray(dy).reshape(N, K, H * W)
    xr = x.reshape(N, C, H * W)
    dx = np.empty((N, C, H * W), dtype=x.dtype) if need_x else None

    def run(lo, hi):
        part = np.matmul(dyr[lo:hi], xr[lo:hi].transpose(0, 2, 1)).sum(axis=0) \
            if need_w else None  # (K, C)
        db = _bias_sum(dyr[lo:hi]) if need_b else None
        if need_x:
            np.matmul(w.T, dyr[lo:hi], out=dx[lo:hi])
        return part, db

    parts = over_images(run, image_chunks(N))
    dweight = dbias = None
    if need_w:
        dweight = summed([p for p, _ in parts]).reshape(weight.shape).astype(x.dtype,
                                                                             copy=False)
    if need_b:
        dbias = summed([db for _, db in parts]).astype(x.dtype)
    return (None if dx is None else dx.reshape(x.shape)), dweight, dbias


def _image_geometry(cache):
    """(kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo), as im2col/col2im and the packed GEMM take it."""
    (sh, sw), ((pt, _), (pl, _)), (dh, dw) = cache.stride, cache.pads, cache.dilation
    kh, kw = cache.weight.shape[2:]
    return kh, kw, sh, sw, pt, pl, dh, dw, *cache.out_hw


def image_forward(x, weight, bias, cache):
    """y[n] = W (K, C kh kw) @ cols(x[n]), one image's cols at a time (numpy's GEMM)."""
    x = cache.x = np.ascontiguousarray(x)
    N, K = x.shape[0], weight.shape[0]
    R, P = weight[0].size, cache.out_hw[0] * cache.out_hw[1]
    w = np.ascontiguousarray(weight).reshape(K, R)
    geometry = _image_geometry(cache)
    y = np.empty((N, K, P), dtype=x.dtype)

    def run(lo, hi):
        cols = np.empty((R, P), dtype=x.dtype)
        for n in range(lo, hi):
            conv_cpu.im2col_nogil(x[n:n + 1], *geometry, cols)
            np.matmul(w, cols, out=y[n])
            if bias is not None:
                y[n] += bias.reshape(K, 1)

    over_images(run, image_chunks(N))
    return y.reshape(N, K, *cache.out_hw)


def image_backward(dy, cache, needs):
    """The image and packed paths' backward: per image, dW^T += cols(x[n]) @ dy[n]^T and
    dx[n] = col2im(W^T @ dy[n]), numpy's GEMMs. dW is computed transposed: OpenBLAS ran
    cols @ dy[n]^T faster than dy[n] @ cols^T (benchmarks/RESULTS.md, "Convolution:
    implicit GEMM on the packed C kernel")."""
    need_x, need_w, need_b = needs
    x, weight = cache.x, cache.weight
    N, K = x.shape[0], weight.shape[0]
    R, P = weight[0].size, cache.out_hw[0] * cache.out_hw[1]
    w = np.ascontiguousarray(weight).reshape(K, R)
    dyr = np.ascontiguousarray(dy).reshape(N, K, P)
    geometry = _image_geometry(cache)
    dx = np.empty(x.shape, dtype=x.dtype) if need_x else None

    def run(lo, hi):
        cols = np.empty((R, P), dtype=x.dtype)
        dw = part = None
        if need_w:  # dW^T (R, K)
            dw = np.zeros((R, K), dtype=x.dtype)
            part = np.empty((R, K), dtype=x.dtype)
        for n in range(lo, hi):
            if need_w:
                conv_cpu.im2col_nogil(x[n:n + 1], *geometry, cols)
                np.matmul(cols, dyr[n].T, out=part)
                dw += part
            if need_x:
                np.matmul(w.T, dyr[n], out=cols)
                conv_cpu.col2im_nogil(cols, *geometry, dx[n:n + 1])
        return dw, (_bias_sum(dyr[lo:hi]) if need_b else None)

    parts = over_images(run, image_chunks(N))
    dweight = dbias = None
    if need_w:
        dweight = np.ascontiguousarray(summed([dw for dw, _ in parts]).T).reshape(
            weight.shape)
    if need_b:
        dbias = summed([db for _, db in parts]).astype(x.dtype)
    return dx, dweight, dbias


def packed_forward(x, weight, bias, cache):
    """y[n] = W @ cols(x[n]) by ``conv_packed_cpu.forward``, blocks of output pixels of
    ``PACKED_BLOCK_BYTES`` of panels, one call per run of images."""
    x = cache.x = np.ascontiguousarray(x)
    N, K = x.shape[0], weight.shape[0]
    w = np.ascontiguousarray(weight).reshape(K, -1)
    kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo = _image_geometry(cache)
    y = np.empty((N, K, Ho * Wo), dtype=x.dtype)
    b = bias if bias is not None else np.zeros(1, dtype=x.dtype)
    forward = conv_packed_cpu.forward

    def run(lo, hi):
        forward(x, w, b, bias is not None, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, lo, hi,
                PACKED_BLOCK_BYTES, y)

    over_images(run, image_chunks(N))
    return y.reshape(N, K, Ho, Wo)
