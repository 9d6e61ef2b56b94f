"""The CPU convolution's ``window`` path: ``nnkit._ext.conv_window`` (C, conv_window.h).

With stride 1 the im2col row of each tap, laid out on the padded width, is a contiguous run
of the zero-padded image (with stride s, of one of its s_h s_w phase planes), so the GEMM's
right-hand panels are read straight from it: no im2col, no gather. The input gradient is the
same kernel on dy with the flipped, transposed weight (stride 1; a strided layer's dx is no
stride-1 convolution, so it takes the ``image`` path's); the weight gradient reads the rows
of cols from the planes likewise against dy packed once per image. One C call (GIL
released, one run of images per C thread, ``nnkit/_ext/part_threads.h``) per pass.
"""

from __future__ import annotations

import numpy as np

from ..._ext import conv_window
from .cpu_images import image_backward
from .cpu_threads import numba_threads

__all__ = ["forward", "backward", "pack"]


def pack(w2):
    """w2 (M, R) -> (ceil(M / 8), R, 8): tile t holds rows [8 t, 8 t + 8), zeros past M."""
    M, R = w2.shape
    tiles = -(-M // 8)
    packed = np.zeros((tiles * 8, R), dtype=w2.dtype)
    packed[:M] = w2
    return np.ascontiguousarray(packed.reshape(tiles, 8, R).transpose(0, 2, 1))


def _geometry(cache):
    """(C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw), as the C kernels take it."""
    _, C, H, W = cache.x.shape
    K, _, kh, kw = cache.weight.shape
    ((pt, _), (pl, _)), (dh, dw) = cache.pads, cache.dilation
    return (C, H, W, K, kh, kw, pt, pl, dh, dw, *cache.out_hw, *cache.stride)


def forward(x, weight, bias, cache):
    """y = W @ cols(x) with the panels read from the padded image, on the C threads."""
    x = cache.x = np.ascontiguousarray(x)
    K = weight.shape[0]
    wp = pack(np.ascontiguousarray(weight).reshape(K, -1))
    y = np.empty((x.shape[0], K, *cache.out_hw), dtype=x.dtype)
    b = None if bias is None else np.ascontiguousarray(bias)
    conv_window.forward(x, wp, b, y, _geometry(cache), numba_threads())
    return y


def backward(dy, cache, needs):
    """dx = conv(dy, flipped W^T), dW^T = sum_n cols(x[n]) @ dy[n]^T and the bias sums in
    one C call (one run of images per thread, each with its own dW^T and bias sums, added
    here). Strided: dx image by image (``cpu_images.image_backward``)."""
    need_x, need_w, need_b = needs
    x, weight = cache.x, cache.weight
    K, C, kh, kw = weight.shape
    threads = numba_threads()
    geometry = _geometry(cache)
    dx = wfp = acc = db = None
    strided = cache.stride != (1, 1)
    if need_x and not strided:
        dx = np.empty(x.shape, dtype=x.dtype)
        flipped = np.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        wfp = pack(flipped.reshape(C, K * kh * kw))
    if need_w:
        acc = np.zeros(conv_window.accumulator_shape(geometry, x.dtype, threads),
                       dtype=x.dtype)
    if need_b:
        db = np.zeros((threads, K))
    if dx is not None or acc is not None or db is not None:
        conv_window.backward(x, np.ascontiguousarray(dy), wfp, dx, acc, db, geometry, threads)
    if need_x and strided:
        dx = image_backward(dy, cache, (True, False, False))[0]
    dweight = dbias = None
    if need_w:
        dweight = np.ascontiguousarray(acc.sum(axis=0)[:C * kh * kw, :K].T).reshape(
            weight.shape)
    if need_b:
        dbias = db.sum(axis=0).astype(x.dtype)
    return dx, dweight, dbias
