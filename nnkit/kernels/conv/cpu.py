"""The CPU convolution and pooling launchers, with the names of ``nnkit._ext.conv_cuda``'s
(``nnkit._backend.kernels_for`` picks between the two modules):

- ``conv2d_forward(x, weight, bias, cache) -> y`` runs the path ``algorithms.cpu_algorithm``
  picks for the shape (``calibration.choose``'s measured one when that is on) and records
  it in ``cache.algorithm``;
- ``conv2d_backward(dy, cache, needs) -> (dx, dweight, dbias)`` runs that path's backward,
  ``needs`` = (x, weight, bias) wanted (None where not);
- ``release(cache)`` returns the forward's workspace to the pool when no backward will run;
- ``max_pool``, ``max_pool_backward``, ``avg_pool``, ``avg_pool_backward`` fill
  preallocated outputs (``nnkit._ext.conv_cpu``'s kernels).

The paths: ``im2col`` and ``direct`` here, ``pointwise``, ``image`` and ``packed`` in
``cpu_images``, ``window`` in ``cpu_window``, ``winograd`` in ``cpu_winograd``.

``im2col``, the batch at once: cols (C kh kw, N Ho Wo), then

    forward:  Y (K, N Ho Wo) = W (K, C kh kw) @ cols                 (numpy SGEMM/DGEMM)
    backward: dW = dY @ cols^T,   dcols = W^T @ dY,   dx = col2im(dcols)

one GEMM per group. cols is kept from the forward for the backward and then overwritten by
dcols (a backward called twice recomputes it); the buffers come from
``cpu_threads.pool``. Around these GEMMs the Numba kernels run their serial builds
(``SERIAL_AROUND_BLAS``): a parallel kernel's OpenMP workers keep spinning after it returns
and take the second core from the OpenBLAS GEMM that follows, OpenBLAS's spinning threads
slow the next Numba kernel likewise, and a parallel kernel after an idle pause also pays to
wake the second core (benchmarks/RESULTS.md, "Figures moved from docstrings").

``direct``: Numba loops over zero-padded planes (``conv_cpu.direct_*``), for any groups;
the table runs them for depthwise layers.
"""

from __future__ import annotations

import numpy as np

from ..._ext import conv_cpu
from ..._ext.launchers import launchers
from . import algorithms, calibration, cpu_images, cpu_window, cpu_winograd
from .cpu_threads import pool

__all__ = [*launchers("nnkit.kernels.conv.cpu", "conv_cuda"), "SERIAL_AROUND_BLAS"]


def _paths():
    """algorithm -> (forward, backward), looked up at each call."""
    return {"im2col": (_im2col_forward, _im2col_backward),
            "direct": (_direct_forward, _direct_backward),
            "pointwise": (cpu_images.pointwise_forward, cpu_images.pointwise_backward),
            "image": (cpu_images.image_forward, cpu_images.image_backward),
            "packed": (cpu_images.packed_forward, cpu_images.image_backward),
            "window": (cpu_window.forward, cpu_window.backward),
            "winograd": (cpu_winograd.forward, cpu_winograd.backward)}


def conv2d_forward(x, weight, bias, cache):
    """y (N, K, Ho, Wo) of validated x (N, C, H, W), weight, bias (K,) or None, on the path
    the table picks (``cache.algorithm``)."""
    if calibration.ENABLED and algorithms.ALGORITHM is None:
        cache.algorithm = calibration.choose(x, weight, bias, cache, _paths())
    else:
        cache.algorithm = algorithms.cpu_algorithm(x.shape, weight.shape, cache.stride,
                                                   cache.pads, cache.dilation, cache.groups,
                                                   cache.out_hw, x.dtype)
    return _paths()[cache.algorithm][0](x, weight, bias, cache)


def conv2d_backward(dy, cache, needs):
    """(dx, dweight, dbias) on the forward's path; None where ``needs`` says not wanted."""
    return _paths()[cache.algorithm][1](dy, cache, needs)


def release(cache):
    """Return the forward's cols (Winograd: the V of each run of images) to the pool."""
    for cols in (cache.cols if isinstance(cache.cols, list) else [cache.cols]):
        if cols is not None:
            pool.give(cols)
    cache.cols = None


# ---- im2col over the whole batch -----------------------------------------------------------

# Serial Numba builds around the GEMMs (see the module docstring).
SERIAL_AROUND_BLAS = True


def _around_blas(kernel):
    return kernel.serial if SERIAL_AROUND_BLAS else kernel


def _im2col(cache, out):
    (sh, sw), ((pt, _), (pl, _)), (dh, dw) = cache.stride, cache.pads, cache.dilation
    kh, kw = cache.weight.shape[2:]
    _around_blas(conv_cpu.im2col)(cache.x, kh, kw, sh, sw, pt, pl, dh, dw, *cache.out_hw,
                                  out)
    return out


def _im2col_forward(x, weight, bias, cache):
    """Y = W @ cols per group, then the bias added in the transpose back to NCHW; the cols
    stay in ``cache.cols`` for the backward."""
    N, C, H, W = x.shape
    K, Cg, kh, kw = weight.shape
    G, P = cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * kh * kw
    cols = _im2col(cache, pool.take(R * N * P, x.dtype).reshape(R, N * P))
    ykn = pool.take(K * N * P, x.dtype).reshape(K, N * P)
    if G == 1:
        np.matmul(weight.reshape(K, R), cols, out=ykn)  # (K, N P)
    else:
        np.matmul(weight.reshape(G, K // G, Cg * kh * kw), cols.reshape(G, R // G, N * P),
                  out=ykn.reshape(G, K // G, N * P))  # (G, K/G, N P)
    y = np.empty((N, K, P), dtype=x.dtype)
    b = bias if bias is not None else np.zeros(1, dtype=x.dtype)
    _around_blas(conv_cpu.bias_transpose)(ykn.reshape(K, N, P), b, bias is not None,
                                          y)  # (N, K, P)
    pool.give(ykn)
    cache.cols = cols
    return y.reshape(N, K, *cache.out_hw)


def _im2col_backward(dy, cache, needs):
    """dW = dY @ cols^T and dcols = W^T @ dY per group, dx = col2im(dcols); dbias from the
    transpose of dy (which both GEMMs read)."""
    need_x, need_w, need_b = needs
    x, weight = cache.x, cache.weight
    N, C, H, W = x.shape
    K, Cg, kh, kw = weight.shape
    G, P = cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * kh * kw
    dyt = pool.take(K * N * P, x.dtype).reshape(K, N * P)
    dbias = np.empty(K, dtype=x.dtype)
    _around_blas(conv_cpu.transpose_sum)(dy.reshape(N, K, P), dyt.reshape(K, N, P),
                                         dbias)  # (K, N, P)
    dweight = None
    if need_w:
        cols = cache.cols
        if cols is None:  # consumed by an earlier backward through the same graph
            cols = _im2col(cache, pool.take(R * N * P, x.dtype).reshape(R, N * P))
        dweight = np.empty(weight.shape, dtype=x.dtype)
        if G == 1:
            np.matmul(dyt, cols.T, out=dweight.reshape(K, R))
        else:
            np.matmul(dyt.reshape(G, K // G, N * P),
                      cols.reshape(G, R // G, N * P).transpose(0, 2, 1),
                      out=dweight.reshape(G, K // G, Cg * kh * kw))
        cache.cols = cols
    dx = None
    if need_x:
        dcols = cache.cols if cache.cols is not None else pool.take(R * N * P, x.dtype)
        dcols = dcols.reshape(R, N * P)
        cache.cols = None  # overwritten below
        if G == 1:
            np.matmul(weight.reshape(K, R).T, dyt, out=dcols)
        else:
            np.matmul(weight.reshape(G, K // G, Cg * kh * kw).transpose(0, 2, 1),
                      dyt.reshape(G, K // G, N * P), out=dcols.reshape(G, R // G, N * P))
        dx = np.empty(x.shape, dtype=x.dtype)
        (sh, sw), ((pt, _), (pl, _)), (dh, dw) = cache.stride, cache.pads, cache.dilation
        _around_blas(conv_cpu.col2im)(dcols, kh, kw, sh, sw, pt, pl, dh, dw, *cache.out_hw,
                                      dx)
        pool.give(dcols)
    pool.give(dyt)
    return dx, dweight, (dbias if need_b else None)


# ---- direct loops (depthwise) ---------------------------------------------------------------

def _direct_geometry(cache):
    (sh, sw), ((pt, pb), (pl, pr)), (dh, dw) = cache.stride, cache.pads, cache.dilation
    return sh, sw, pt, pl, pb, pr, dh, dw


def _direct_forward(x, weight, bias, cache):
    """Direct loops (``conv_cpu.direct_forward``); no workspace kept for the backward."""
    x = cache.x = np.ascontiguousarray(x)
    N, K = x.shape[0], weight.shape[0]
    y = np.empty((N, K, *cache.out_hw), dtype=x.dtype)
    b = bias if bias is not None else np.zeros(K, dtype=x.dtype)
    conv_cpu.direct_forward(x, np.ascontiguousarray(weight), np.ascontiguousarray(b),
                            *_direct_geometry(cache), y)
    return y


def _direct_backward(dy, cache, needs):
    """dweight and dbias in one pass over x (``direct_backward_weight``; dbias alone by
    ``direct_backward_bias``, the same sums), dx by ``direct_backward_input``."""
    need_x, need_w, need_b = needs
    x, weight = cache.x, np.ascontiguousarray(cache.weight)
    dy = np.ascontiguousarray(dy)
    dx = dweight = dbias = None
    if need_w or need_b:
        dbias = np.empty(weight.shape[0], dtype=x.dtype)
    if need_w:
        dweight = np.empty(weight.shape, dtype=x.dtype)
        conv_cpu.direct_backward_weight(x, dy, *_direct_geometry(cache), dweight, dbias)
    elif need_b:
        conv_cpu.direct_backward_bias(dy, dbias)
    if need_x:
        dx = np.empty(x.shape, dtype=x.dtype)
        conv_cpu.direct_backward_input(dy, weight, *_direct_geometry(cache), dx)
    return dx, dweight, (dbias if need_b else None)


# ---- pooling ---------------------------------------------------------------------------------

def max_pool(x, kernel, stride, padding, dilation, y, idx):
    """y = window max of x (N, C, H, W), idx = h W + w of the routed maximum (torch's rule)."""
    conv_cpu.max_pool(x, *kernel, *stride, *padding, *dilation, y, idx)


def max_pool_backward(dy, idx, kernel, stride, padding, dilation, dx):
    """dx[n, c, h, w] = sum of dy over the windows whose argmax is (h, w)."""
    conv_cpu.max_pool_backward(dy, idx, dx)


def avg_pool(x, kernel, stride, padding, count_include_pad, divisor, y):
    """y = window mean; divisor ``conv_cpu.avg_divisor`` (divisor_override if nonzero)."""
    conv_cpu.avg_pool(x, *kernel, *stride, *padding, count_include_pad, divisor, y)


def avg_pool_backward(dy, kernel, stride, padding, count_include_pad, divisor, dx):
    """dx = sum over the windows holding (h, w) of dy / divisor."""
    conv_cpu.avg_pool_backward(dy, *kernel, *stride, *padding, count_include_pad, divisor,
                               dx)
