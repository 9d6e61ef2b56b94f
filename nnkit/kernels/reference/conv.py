"""Naive twins of the convolution and pooling kernels, written straight from the formulas.

Plain Python loops in float64, cast back to the input's dtype; nothing here is fast. The
2-D cross-correlation of notes §4.2, with channels, groups, stride ``s``,
zero padding (top ``pt``, left ``pl``) and dilation ``d``::

    y[n, k, a, b] = bias[k] + sum_{c in group(k)} sum_{i, j}
                    w[k, c - g0, i, j] * xpad[n, c, a s_h + i d_h, b s_w + j d_w]

(torch's convention: a cross-correlation, i.e. the convolution of notes §4.2 with a flipped kernel).
Max pooling takes ``max{x[a s + i d, b s + j d] | i, j in [0, r)}`` over a window padded
with -inf and routes the gradient to the first maximum in row-major window order (NaN wins,
as torch); average pooling divides by ``divisor_override``, or by the number of window cells
inside the padded input (``count_include_pad``), or by the number of in-bounds entries.
``ceil_mode`` rounds the window count up, dropping a last window that would start in the
right padding (torch's rule); windows are clipped at the input's edge.

Padding arguments: an int, a pair (ph, pw) (both sides), a 4-tuple (top, bottom, left,
right), or 'valid' / 'same' (stride 1; the extra entry of an odd total goes bottom/right,
as torch).

``<op>_forward``/``<op>_backward`` mirror ``nnkit.kernels.conv``'s pairs: the public
forward's arguments, ``(out, cache)`` with the arguments as the cache, and ``(dy, cache,
needs=None)`` -> one gradient per input, None where ``needs`` says not wanted (and dbias
None without a bias). ``conv2d``, ``conv1d``, ``max_pool2d`` and ``avg_pool2d`` give the
output alone.
"""

from __future__ import annotations

import math

import numpy as np

from ..._types import Array, Needs

__all__ = [
    "conv2d",
    "conv2d_forward",
    "conv2d_backward",
    "conv1d",
    "conv1d_forward",
    "conv1d_backward",
    "max_pool2d",
    "max_pool2d_forward",
    "max_pool2d_backward",
    "avg_pool2d",
    "avg_pool2d_forward",
    "avg_pool2d_backward",
]


def _needs(needs, count):
    return (True,) * count if needs is None else tuple(bool(n) for n in needs)


def _masked(grads, needs):
    """The gradients, None where ``needs`` says not wanted."""
    return tuple(g if n else None for g, n in zip(grads, _needs(needs, len(grads)),
                                                  strict=True))


def _pair(v):
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _pads(padding, kh, kw, dh, dw):
    """(top, bottom, left, right)."""
    if padding == "valid":
        return 0, 0, 0, 0
    if padding == "same":
        th, tw = dh * (kh - 1), dw * (kw - 1)
        return th // 2, th - th // 2, tw // 2, tw - tw // 2
    if isinstance(padding, int):
        return padding, padding, padding, padding
    if len(padding) == 4:
        return tuple(int(p) for p in padding)
    return padding[0], padding[0], padding[1], padding[1]


def _padded(x, pads, fill=0.0):
    """x (N, C, H, W) as float64, padded with ``fill``."""
    pt, pb, pl, pr = pads
    N, C, H, W = x.shape
    out = np.full((N, C, H + pt + pb, W + pl + pr), fill, dtype=np.float64)
    for n in range(N):
        for c in range(C):
            for h in range(H):
                for w in range(W):
                    out[n, c, h + pt, w + pl] = x[n, c, h, w]
    return out


def _out_size(size, k, s, d):
    return (size - d * (k - 1) - 1) // s + 1


def conv2d(x: Array, weight: Array, bias: Array | None = None, stride: int | tuple[int, ...] = 1,
           padding: int | tuple[int, ...] | str = 0, dilation: int | tuple[int, ...] = 1,
           groups: int = 1) -> Array:
    """y (N, K, Ho, Wo) from x (N, C, H, W), weight (K, C/groups, kh, kw), bias (K,)."""
    x, weight = np.asarray(x), np.asarray(weight)
    K, Cg, kh, kw = weight.shape
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    xp = _padded(x, _pads(padding, kh, kw, dh, dw))
    N, C, Hp, Wp = xp.shape
    Ho, Wo = _out_size(Hp, kh, sh, dh), _out_size(Wp, kw, sw, dw)
    Kg = K // groups
    y = np.zeros((N, K, Ho, Wo), dtype=np.float64)
    for n in range(N):
        for k in range(K):
            g0 = (k // Kg) * Cg  # first input channel of k's group
            for a in range(Ho):
                for b in range(Wo):
                    s = 0.0 if bias is None else float(bias[k])
                    for c in range(Cg):
                        for i in range(kh):
                            for j in range(kw):
                                s += (float(weight[k, c, i, j])
                                      * xp[n, g0 + c, a * sh + i * dh, b * sw + j * dw])
                    y[n, k, a, b] = s
    return y.astype(x.dtype)


def conv2d_forward(x: Array, weight: Array, bias: Array | None = None,
                   stride: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] | str = 0,
                   dilation: int | tuple[int, ...] = 1, groups: int = 1) -> tuple[Array, tuple]:
    """(y, cache): ``conv2d``, and the arguments as the cache."""
    y = conv2d(x, weight, bias, stride, padding, dilation, groups)
    return y, (x, weight, bias, stride, padding, dilation, groups)


def conv2d_backward(dy: Array, cache: tuple, needs: Needs = None) -> tuple[Array | None, ...]:
    """(dx, dweight, dbias) of ``conv2d_forward``: each product of the forward sum,
    differentiated::

        dxpad[n, c, a s + i d, b s + j d] += dy[n, k, a, b] w[k, c - g0, i, j]
        dw[k, c - g0, i, j] += dy[n, k, a, b] xpad[n, c, a s + i d, b s + j d]
        dbias[k] += dy[n, k, a, b]

    ``needs``: which of (x, weight, bias) want one (None: all); dbias None without a bias.
    """
    x, weight, bias, stride, padding, dilation, groups = cache
    dx, dw, db = _conv2d_grads(dy, x, weight, stride, padding, dilation, groups)
    return _masked((dx, dw, None if bias is None else db), needs)


def _conv2d_grads(dy, x, weight, stride, padding, dilation, groups):
    """(dx, dweight, dbias) of ``conv2d`` for upstream dy, all three."""
    x, weight, dy = np.asarray(x), np.asarray(weight), np.asarray(dy)
    K, Cg, kh, kw = weight.shape
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    pads = _pads(padding, kh, kw, dh, dw)
    xp = _padded(x, pads)
    dxp = np.zeros_like(xp)
    dwt = np.zeros(weight.shape, dtype=np.float64)
    db = np.zeros(K, dtype=np.float64)
    N, _, Ho, Wo = dy.shape
    Kg = K // groups
    for n in range(N):
        for k in range(K):
            g0 = (k // Kg) * Cg
            for a in range(Ho):
                for b in range(Wo):
                    g = float(dy[n, k, a, b])
                    db[k] += g
                    for c in range(Cg):
                        for i in range(kh):
                            for j in range(kw):
                                h, w = a * sh + i * dh, b * sw + j * dw
                                dxp[n, g0 + c, h, w] += g * float(weight[k, c, i, j])
                                dwt[k, c, i, j] += g * xp[n, g0 + c, h, w]
    pt, _, pl, _ = pads
    dx = dxp[:, :, pt:pt + x.shape[2], pl:pl + x.shape[3]]
    return dx.astype(x.dtype), dwt.astype(weight.dtype), db.astype(weight.dtype)


def _pads_1d(padding, k, d):
    if isinstance(padding, str):
        return padding
    if isinstance(padding, int):
        return (0, 0, padding, padding)
    return (0, 0, int(padding[0]), int(padding[1]))  # (left, right)


def conv1d(x: Array, weight: Array, bias: Array | None = None, stride: int | tuple[int, ...] = 1,
           padding: int | tuple[int, ...] | str = 0, dilation: int | tuple[int, ...] = 1,
           groups: int = 1) -> Array:
    """y (N, K, Lo) from x (N, C, L), weight (K, C/groups, k): ``conv2d`` on a height-1 image."""
    x, weight = np.asarray(x), np.asarray(weight)
    pads = _pads_1d(padding, weight.shape[2], dilation)
    if pads == "same":
        t = dilation * (weight.shape[2] - 1)
        pads = (0, 0, t // 2, t - t // 2)
    y = conv2d(x[:, :, None, :], weight[:, :, None, :], bias, (1, stride), pads, (1, dilation),
               groups)
    return y[:, :, 0, :]


def conv1d_forward(x: Array, weight: Array, bias: Array | None = None,
                   stride: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] | str = 0,
                   dilation: int | tuple[int, ...] = 1, groups: int = 1) -> tuple[Array, tuple]:
    """(y, cache): ``conv1d``, and the arguments as the cache."""
    y = conv1d(x, weight, bias, stride, padding, dilation, groups)
    return y, (x, weight, bias, stride, padding, dilation, groups)


def conv1d_backward(dy: Array, cache: tuple, needs: Needs = None) -> tuple[Array | None, ...]:
    """(dx, dweight, dbias) of ``conv1d_forward``; ``needs`` as in ``conv2d_backward``."""
    x, weight, bias, stride, padding, dilation, groups = cache
    x, weight, dy = np.asarray(x), np.asarray(weight), np.asarray(dy)
    pads = _pads_1d(padding, weight.shape[2], dilation)
    if pads == "same":
        t = dilation * (weight.shape[2] - 1)
        pads = (0, 0, t // 2, t - t // 2)
    dx, dw, db = _conv2d_grads(dy[:, :, None, :], x[:, :, None, :], weight[:, :, None, :],
                               (1, stride), pads, (1, dilation), groups)
    return _masked((dx[:, :, 0, :], dw[:, :, 0, :], None if bias is None else db), needs)


def _pool_out(size, k, s, p, d, ceil_mode):
    """Windows along one axis: floor (or ceil) of (size + 2p - d (k - 1) - 1) / s, plus 1;
    in ceil mode a last window starting in the right padding (at >= size + p) is dropped."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    return out - 1 if ceil_mode and (out - 1) * s >= size + p else out


def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode):
    kh, kw = _pair(kernel_size)
    sh, sw = (kh, kw) if stride is None else _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    N, C, H, W = x.shape
    Ho = _pool_out(H, kh, sh, ph, dh, ceil_mode)
    Wo = _pool_out(W, kw, sw, pw, dw, ceil_mode)
    return (N, C, H, W), (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo)


def _argmax_windows(x, kernel_size, stride, padding, dilation, ceil_mode):
    """Yield (n, c, a, b, (h*, w*), max): each window's routed maximum ((-1, -1): all padding)."""
    (N, C, H, W), (kh, kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = _pool_geometry(
        x, kernel_size, stride, padding, dilation, ceil_mode)
    for n in range(N):
        for c in range(C):
            for a in range(Ho):
                for b in range(Wo):
                    cells = [(a * sh - ph + i * dh, b * sw - pw + j * dw)
                             for i in range(kh) for j in range(kw)]
                    inside = [(h, w) for h, w in cells if 0 <= h < H and 0 <= w < W]
                    best, arg = -math.inf, (inside[0] if inside else (-1, -1))
                    for h, w in inside:  # torch: (v > best) or isnan(v), so the last NaN wins
                        v = float(x[n, c, h, w])
                        if v > best or math.isnan(v):
                            best, arg = v, (h, w)
                    yield n, c, a, b, arg, best


def max_pool2d(x: Array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
               dilation: int | tuple[int, int] = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Array | tuple[Array, Array]:
    """y[n, c, a, b] = max{x[n, c, a s - p + i d, b s - p + j d] | i, j in [0, r)}; with
    ``return_indices`` also idx = h W + w of each routed maximum (int64, -1: all padding)."""
    x = np.asarray(x)
    *_, (Ho, Wo) = _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode)
    y = np.empty((x.shape[0], x.shape[1], Ho, Wo), dtype=np.float64)
    idx = np.empty(y.shape, dtype=np.int64)
    for n, c, a, b, (h, w), best in _argmax_windows(x, kernel_size, stride, padding, dilation,
                                                    ceil_mode):
        y[n, c, a, b] = best
        idx[n, c, a, b] = h * x.shape[3] + w if h >= 0 else -1
    return (y.astype(x.dtype), idx) if return_indices else y.astype(x.dtype)


def max_pool2d_forward(x: Array, kernel_size: int | tuple[int, int],
                       stride: int | tuple[int, int] | None = None,
                       padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
                       ceil_mode: bool = False) -> tuple[Array, tuple]:
    """(y, cache): ``max_pool2d``, and the arguments as the cache."""
    y = max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode)
    return y, (x, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d_backward(dy: Array, cache: tuple, needs: Needs = None) -> Array:
    """dx of ``max_pool2d_forward``: each window's dy goes to its first maximum (row-major),
    summed over windows."""
    x, kernel_size, stride, padding, dilation, ceil_mode = cache
    x, dy = np.asarray(x), np.asarray(dy)
    dx = np.zeros(x.shape, dtype=np.float64)
    for n, c, a, b, (h, w), _ in _argmax_windows(x, kernel_size, stride, padding, dilation,
                                                 ceil_mode):
        if h >= 0:
            dx[n, c, h, w] += float(dy[n, c, a, b])
    return dx.astype(x.dtype)


def _avg_windows(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                 divisor_override):
    """Yield (n, c, a, b, in-bounds (h, w) list, divisor): divisor_override, else the number
    of window cells inside the padded input (count_include_pad) or inside the input."""
    (N, C, H, W), (kh, kw), (sh, sw), (ph, pw), _, (Ho, Wo) = _pool_geometry(
        x, kernel_size, stride, padding, 1, ceil_mode)
    for n in range(N):
        for c in range(C):
            for a in range(Ho):
                for b in range(Wo):
                    cells = [(a * sh - ph + i, b * sw - pw + j)
                             for i in range(kh) for j in range(kw)]
                    inside = [(h, w) for h, w in cells if 0 <= h < H and 0 <= w < W]
                    padded = [(h, w) for h, w in cells if -ph <= h < H + ph and -pw <= w < W + pw]
                    div = divisor_override or (len(padded) if count_include_pad else len(inside))
                    yield n, c, a, b, inside, div


def avg_pool2d(x: Array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Array:
    """y[n, c, a, b] = sum of the window's in-bounds entries / divisor (torch's order)."""
    x = np.asarray(x)
    *_, (Ho, Wo) = _pool_geometry(x, kernel_size, stride, padding, 1, ceil_mode)
    y = np.empty((x.shape[0], x.shape[1], Ho, Wo), dtype=np.float64)
    for n, c, a, b, inside, div in _avg_windows(x, kernel_size, stride, padding, ceil_mode,
                                                count_include_pad, divisor_override):
        y[n, c, a, b] = sum(float(x[n, c, h, w]) for h, w in inside) / div
    return y.astype(x.dtype)


def avg_pool2d_forward(x: Array, kernel_size: int | tuple[int, int],
                       stride: int | tuple[int, int] | None = None,
                       padding: int | tuple[int, int] = 0, ceil_mode: bool = False,
                       count_include_pad: bool = True, divisor_override: int | None = None
                       ) -> tuple[Array, tuple]:
    """(y, cache): ``avg_pool2d``, and the arguments as the cache."""
    args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return avg_pool2d(x, *args), (x, *args)


def avg_pool2d_backward(dy: Array, cache: tuple, needs: Needs = None) -> Array:
    """dx of ``avg_pool2d_forward``: dx[n, c, h, w] = sum over the windows holding (h, w) of
    dy / divisor."""
    x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override = cache
    x, dy = np.asarray(x), np.asarray(dy)
    dx = np.zeros(x.shape, dtype=np.float64)
    for n, c, a, b, inside, div in _avg_windows(x, kernel_size, stride, padding, ceil_mode,
                                                count_include_pad, divisor_override):
        for h, w in inside:
            dx[n, c, h, w] += float(dy[n, c, a, b]) / div
    return dx.astype(x.dtype)
