"""Max and average pooling: validated forward/backward pairs, torch's semantics.

``max_pool2d_forward(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False)
-> (y, cache)`` and ``max_pool2d_backward(dy, cache, needs=None) -> dx``; likewise
``avg_pool2d_*`` (torch's argument order). ``nnkit._backend.kernels_for`` picks the
launchers (``nnkit.kernels.conv.cpu`` or ``nnkit._ext.conv_cuda``, the same names).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..._backend import array_module, backend, kernels_for
from ..._types import Array, Needs
from ..._validation import (
    FLOATS,
    check_array,
    check_bool,
    check_cache,
    check_grad,
    check_int_tuple,
    check_scalar,
)

__all__ = ["PoolCache", "check_divisor", "pool_params", "pool_output_size",
           "max_pool2d_forward", "max_pool2d_backward", "avg_pool2d_forward",
           "avg_pool2d_backward"]


@dataclass
class PoolCache:
    """What the pooling backward needs: x's shape, the geometry, and max pooling's argmax."""

    x_shape: tuple
    dtype: object
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    count_include_pad: bool
    out_hw: tuple
    idx: object = None  # max pooling: int64 (N, C, Ho, Wo), h W + w of each routed maximum
    device: str = "cpu"  # x's: 'cpu' or 'cuda' (``nnkit._backend.backend``)
    divisor: int = 0  # avg pooling's divisor_override, 0 for none


def _kernels(x):
    """The pooling launchers for x's device."""
    return kernels_for("nnkit.kernels.conv.cpu", "conv_cuda", x)


def check_divisor(divisor_override):
    """divisor_override as an int, 0 for None; torch's rule: a nonzero int."""
    if divisor_override is None:
        return 0
    check_scalar(divisor_override, name="divisor_override", kind=numbers.Integral,
                 low=-(2**63 - 1), high=2**63 - 1)
    if divisor_override == 0:
        raise ValueError("divisor_override must be a nonzero int or None (as torch), got 0")
    return int(divisor_override)


def pool_params(kernel_size, stride=None, padding=0, dilation=1):
    """(kernel, stride, padding, dilation) as int pairs, validated as torch does.

    stride None (or empty) means kernel_size; padding at most half the kernel per axis.
    """
    kernel = check_int_tuple(kernel_size, 2, name="kernel_size", low=1)
    empty = isinstance(stride, (tuple, list)) and len(stride) == 0
    stride = kernel if stride is None or empty else \
        check_int_tuple(stride, 2, name="stride", low=1)
    pad = check_int_tuple(padding, 2, name="padding", low=0)
    dilation = check_int_tuple(dilation, 2, name="dilation", low=1)
    if any(2 * p > k for p, k in zip(pad, kernel, strict=True)):
        raise ValueError(f"padding {pad} must be at most half of kernel_size {kernel} "
                         f"(as torch)")
    return kernel, stride, pad, dilation


def pool_output_size(size, kernel, stride, pad, dilation, ceil_mode):
    """torch's pooling_output_shape: ``floor`` (or ``ceil``) of
    ``(size + 2 pad - dilation (kernel - 1) - 1) / stride``, plus 1; in ceil mode a last
    window that would start in the right padding is dropped."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool_args(x, kernel_size, stride, padding, dilation, ceil_mode, what):
    x = check_array(x, name="x", dtype=FLOATS)
    if x.ndim != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W) for {what}, got shape {tuple(x.shape)}")
    kernel, stride, pad, dilation = pool_params(kernel_size, stride, padding, dilation)
    ceil_mode = check_bool(ceil_mode, name="ceil_mode")
    out_hw = tuple(pool_output_size(s, k, st, p, d, ceil_mode) for s, k, st, p, d
                   in zip(x.shape[2:], kernel, stride, pad, dilation, strict=True))
    if min(x.shape[2:]) < 1:  # padding alone would make room for windows, all in the padding
        raise ValueError(f"{what}: x has shape {tuple(x.shape)}, an empty (H, W) plane; H and W "
                         f"must be >= 1 (as torch)")
    if min(out_hw) < 1:
        raise ValueError(f"{what}: output size {out_hw} is too small: x has shape "
                         f"{tuple(x.shape)}, kernel_size {kernel}, stride {stride}, padding "
                         f"{pad}, dilation {dilation}, ceil_mode={ceil_mode}")
    return x, kernel, stride, pad, dilation, out_hw


def max_pool2d_forward(x: Array, kernel_size: int | tuple[int, int],
                       stride: int | tuple[int, int] | None = None,
                       padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
                       ceil_mode: bool = False) -> tuple[Array, PoolCache]:
    """Max pooling (torch's max_pool2d), with the argmax cache.

    ``y[n, c, a, b] = max{xpad[n, c, a s + i d, b s + j d] | i, j in [0, r)}``, padded with
    -inf; ``ceil_mode`` only adds windows (clipped at the input's edge), see
    ``pool_output_size``. The gradient goes to the first maximum in row-major window order
    (NaN wins).

    Parameters
    ----------
    x : ndarray (N, C, H, W), float32 or float64
    kernel_size : int or (int, int)
    stride : default kernel_size
    padding : int or pair, at most half the kernel
    dilation : int or pair
    ceil_mode : bool

    Returns
    -------
    y : ndarray (N, C, Ho, Wo)
    cache : PoolCache
        ``cache.idx`` int64 (N, C, Ho, Wo) holds torch's ``return_indices``: h W + w of each
        window's maximum in its (H, W) plane (-1 for a window lying wholly in the padding,
        possible with dilation, where y is -inf)

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.conv import max_pool2d_forward
    >>> max_pool2d_forward(np.arange(16.0).reshape(1, 1, 4, 4), 2)[0][0, 0]
    array([[ 5.,  7.],
           [13., 15.]])
    """
    x, kernel, stride, pad, dilation, out_hw = _pool_args(x, kernel_size, stride, padding,
                                                          dilation, ceil_mode, "max_pool2d")
    xp = array_module(x)
    y = xp.empty(x.shape[:2] + out_hw, dtype=x.dtype)
    idx = xp.empty(x.shape[:2] + out_hw, dtype=np.int64)
    cache = PoolCache(tuple(x.shape), x.dtype, kernel, stride, pad, dilation, True, out_hw,
                      idx, backend(x))
    _kernels(x).max_pool(x, kernel, stride, pad, dilation, y, idx)
    return y, cache


def _check_pool_dy(dy, cache):
    check_cache(cache, PoolCache, forward="the pooling forward")
    return check_grad(dy, shape=cache.x_shape[:2] + cache.out_hw, dtype=cache.dtype,
                      device=cache.device)


def max_pool2d_backward(dy: Array, cache: PoolCache, needs: Needs = None) -> Array:
    """dx (N, C, H, W): dy[n, c, a, b] added at each window's routed maximum. ``needs``:
    ``nnkit.autograd.apply_op``'s mask (the one input always needs its gradient)."""
    dy = _check_pool_dy(dy, cache)
    dx = array_module(dy).empty(cache.x_shape, dtype=cache.dtype)
    _kernels(dy).max_pool_backward(dy, cache.idx, cache.kernel, cache.stride, cache.padding,
                                   cache.dilation, dx)
    return dx


def avg_pool2d_forward(x: Array, kernel_size: int | tuple[int, int],
                       stride: int | tuple[int, int] | None = None,
                       padding: int | tuple[int, int] = 0, ceil_mode: bool = False,
                       count_include_pad: bool = True, divisor_override: int | None = None
                       ) -> tuple[Array, PoolCache]:
    """Average pooling (torch's avg_pool2d): arguments in torch's order.

    ``y[n, c, a, b] = sum of the in-bounds window entries / D``, with torch's D:
    ``divisor_override`` if given, else the window clipped to the padded input
    (``count_include_pad``, torch's default: kh kw except for ceil_mode's last windows), else
    the number of in-bounds entries.

    Parameters
    ----------
    x : ndarray (N, C, H, W), float32 or float64
    kernel_size, stride, padding : as ``max_pool2d_forward`` (no dilation)
    ceil_mode, count_include_pad : bool; divisor_override : nonzero int or None

    Returns
    -------
    y : ndarray (N, C, Ho, Wo); cache : PoolCache

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.conv import avg_pool2d_forward
    >>> avg_pool2d_forward(np.arange(16.0).reshape(1, 1, 4, 4), 2)[0][0, 0]
    array([[ 2.5,  4.5],
           [10.5, 12.5]])
    """
    x, kernel, stride, pad, dilation, out_hw = _pool_args(x, kernel_size, stride, padding, 1,
                                                          ceil_mode, "avg_pool2d")
    include = check_bool(count_include_pad, name="count_include_pad")
    divisor = check_divisor(divisor_override)
    y = array_module(x).empty(x.shape[:2] + out_hw, dtype=x.dtype)
    cache = PoolCache(tuple(x.shape), x.dtype, kernel, stride, pad, dilation, include, out_hw,
                      None, backend(x), divisor)
    _kernels(x).avg_pool(x, kernel, stride, pad, include, divisor, y)
    return y, cache


def avg_pool2d_backward(dy: Array, cache: PoolCache, needs: Needs = None) -> Array:
    """dx (N, C, H, W): each window's dy / D spread over its in-bounds entries. ``needs``
    as in ``max_pool2d_backward``."""
    dy = _check_pool_dy(dy, cache)
    dx = array_module(dy).empty(cache.x_shape, dtype=cache.dtype)
    _kernels(dy).avg_pool_backward(dy, cache.kernel, cache.stride, cache.padding,
                                   cache.count_include_pad, cache.divisor, dx)
    return dx
