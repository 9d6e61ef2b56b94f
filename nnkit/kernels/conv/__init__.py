"""Convolution and pooling: validated forward/backward pairs on the kernels' convention.

``conv2d_forward(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) ->
(y, cache)`` and ``conv2d_backward(dy, cache, needs=None) -> (dx, dweight, dbias)``, where
``needs`` says which of (x, weight, bias) want a gradient (``nnkit.autograd.apply_op``'s
mask; None: all): the others are None and are not computed (a network's first layer skips
dx, frozen weights skip dweight), and dbias is None also when the forward had no bias. The
pairs go to ``apply_op`` as they are. ``conv1d_*`` run the same code on a height-1 image;
``max_pool2d_*`` and ``avg_pool2d_*`` (``pooling``) take ``needs`` likewise. The formula
(notes §4.2, as torch computes it: a cross-correlation) is::

    y[n, k, a, b] = bias[k] + sum_{c in group(k), i, j}
                    w[k, c, i, j] xpad[n, c, a s_h + i d_h, b s_w + j d_w]

The package:

- here, the pairs and their validation. ``nnkit._backend.kernels_for`` picks the launchers:
  ``nnkit.kernels.conv.cpu`` for NumPy arrays, ``nnkit._ext.conv_cuda`` for GPU arrays. Both
  expose ``conv2d_forward(x, weight, bias, cache)``, ``conv2d_backward(dy, cache, needs)``,
  ``release(cache)`` and the pooling launchers;
- ``algorithms``: the CPU algorithm for each shape, the one table, with why each shape goes
  where;
- the CPU paths: ``cpu`` (the launchers, the batch-wide im2col and the direct loops),
  ``cpu_images`` (pointwise, im2col image by image, the implicit GEMM on the packed C
  kernel), ``cpu_window`` (the window GEMM), ``cpu_winograd`` (F(4x4, 3x3)) and
  ``cpu_threads`` (the runs of images on threads, the workspace pool);
- the CUDA path, ``nnkit._ext.conv_cuda``: the batch-wide im2col with Numba CUDA im2col and
  col2im kernels around cuBLAS GEMMs (through CuPy);
- ``pooling``: max and average pooling.

Figures: benchmarks/RESULTS.md, "Convolution algorithms by shape", "Convolution" (against
torch), "On an NVIDIA H100" and "Figures moved from docstrings".
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from ..._backend import backend, kernels_for
from ..._types import Array, Needs
from ..._validation import (
    FLOATS,
    check_array,
    check_cache,
    check_grad,
    check_int_tuple,
    check_same_device,
    check_same_dtype,
    check_scalar,
)
from .pooling import (
    PoolCache,
    avg_pool2d_backward,
    avg_pool2d_forward,
    check_divisor,
    max_pool2d_backward,
    max_pool2d_forward,
    pool_output_size,
    pool_params,
)

__all__ = [
    "ConvCache",
    "conv2d_forward",
    "conv2d_backward",
    "conv1d_forward",
    "conv1d_backward",
    "release",
    "conv_output_size",
    "PoolCache",
    "check_divisor",
    "pool_params",
    "pool_output_size",
    "max_pool2d_forward",
    "max_pool2d_backward",
    "avg_pool2d_forward",
    "avg_pool2d_backward",
]

CPU, CUDA = "nnkit.kernels.conv.cpu", "conv_cuda"  # the launcher modules (kernels_for)


def _kernels(x):
    """The convolution launchers for x's device."""
    return kernels_for(CPU, CUDA, x)


# ---- geometry and validation --------------------------------------------------------------

def _padding(padding, kernel, dilation, stride, nd):
    """(before, after) per spatial axis from int, tuple, 'valid' or 'same' (torch's split)."""
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise ValueError(f"padding must be 'valid', 'same', an int or a tuple of ints; "
                             f"got {padding!r}")
        if padding == "valid":
            return ((0, 0),) * nd
        if any(s != 1 for s in stride):
            raise ValueError(f"padding='same' needs stride 1 (as torch), got stride={stride}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in check_int_tuple(padding, nd, name="padding", low=0))


def conv_output_size(size, kernel, stride, before, after, dilation):
    """floor((size + before + after - dilation (kernel - 1) - 1) / stride) + 1."""
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def _check_conv_inputs(x, weight, bias, groups, nd):
    """Arrays of one dtype and device; shapes consistent; raises naming the shapes."""
    letters = "(N, C, H, W)" if nd == 2 else "(N, C, L)"
    x = check_array(x, name="x", dtype=FLOATS)
    weight = check_array(weight, name="weight", dtype=FLOATS)
    if x.ndim != nd + 2:
        raise ValueError(f"x must be {nd + 2}-D {letters} for conv{nd}d, got shape "
                         f"{tuple(x.shape)}")
    if weight.ndim != nd + 2:
        raise ValueError(f"weight must be {nd + 2}-D (K, C/groups, "
                         f"{'kh, kw' if nd == 2 else 'k'}), got shape {tuple(weight.shape)}")
    groups = check_scalar(groups, name="groups", kind=numbers.Integral, low=1)
    C, K, Cg = x.shape[1], weight.shape[0], weight.shape[1]
    if C % groups or K % groups:
        raise ValueError(f"groups={groups} must divide the input channels (x shape "
                         f"{tuple(x.shape)}: C={C}) and the output channels (weight shape "
                         f"{tuple(weight.shape)}: K={K})")
    if Cg * groups != C:
        raise ValueError(f"channel mismatch: x has shape {tuple(x.shape)} (C={C}) but weight "
                         f"has shape {tuple(weight.shape)}, which expects C = weight.shape[1] "
                         f"* groups = {Cg} * {groups} = {Cg * groups}")
    if any(s == 0 for s in weight.shape[2:]):
        raise ValueError(f"weight has an empty kernel: shape {tuple(weight.shape)}")
    check_same_device(weight, x, name="weight")
    if bias is not None:
        check_same_device(bias, x, name="bias")
    check_same_dtype(weight, x, name="weight")
    if bias is not None:
        bias = check_array(bias, name="bias", dtype=FLOATS)
        if tuple(bias.shape) != (K,):
            raise ValueError(f"bias must have shape ({K},) for weight of shape "
                             f"{tuple(weight.shape)}, got {tuple(bias.shape)}")
        check_same_dtype(bias, x, name="bias")
    return x, weight, bias, int(groups)


def _check_window_fits(x_shape, kernel, pads, dilation, what="kernel"):
    sizes = x_shape[2:]
    for size, k, (p0, p1), d in zip(sizes, kernel, pads, dilation, strict=True):
        if size + p0 + p1 < d * (k - 1) + 1:
            raise ValueError(
                f"the {what} (size {tuple(kernel)}, dilation {tuple(dilation)}) is larger "
                f"than the padded input: x has shape {tuple(x_shape)}, padding "
                f"{tuple(pads)}; padded spatial size {size + p0 + p1} < {d * (k - 1) + 1}")


def _needs(needs) -> tuple:
    """``needs`` as three bools (x, weight, bias); None: all three."""
    if needs is None:
        return True, True, True
    needs = tuple(bool(n) for n in needs)
    if len(needs) != 3:
        raise ValueError(f"needs must hold 3 bools (x, weight, bias), got {len(needs)}: "
                         f"{needs}")
    return needs


# ---- convolution --------------------------------------------------------------------------

@dataclass
class ConvCache:
    """What ``conv2d_backward`` needs: the inputs, the geometry, and the path's workspace."""

    x: object
    weight: object
    has_bias: bool
    stride: tuple
    pads: tuple  # ((top, bottom), (left, right))
    dilation: tuple
    groups: int
    out_hw: tuple
    cols: object = None  # (C kh kw, N Ho Wo) from the forward, or None once consumed
    squeeze: bool = False  # a conv1d cache: drop the height axis of the gradients
    algorithm: str = "im2col"  # the CPU path ``algorithms.cpu_algorithm`` chose
    wino_u: object = None  # Winograd: the transformed weight (36, K, C); cols holds V
    wino_chunks: object = None  # Winograd: the runs of images [(lo, hi)] each V covers


def conv2d_forward(x: Array, weight: Array, bias: Array | None = None,
                   stride: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] | str = 0,
                   dilation: int | tuple[int, ...] = 1, groups: int = 1) -> tuple[Array, ConvCache]:
    """2-D cross-correlation (torch's conv2d) with its cache for the backward.

    ``y[n, k, a, b] = bias[k] + sum_{c, i, j} w[k, c, i, j] xpad[n, g0 + c, a s + i d, b s + j d]``
    with g0 the first input channel of k's group.

    Parameters
    ----------
    x : ndarray (N, C, H, W), float32 or float64 (NumPy, or CuPy for the CUDA kernels)
    weight : ndarray (K, C / groups, kh, kw), x's dtype
    bias : ndarray (K,) or None
    stride, dilation : int or (int, int), >= 1
    padding : int, (int, int), 'valid' or 'same' (stride 1; odd totals put the extra row and
        column at the bottom/right, as torch)
    groups : int, divides C and K

    Returns
    -------
    y : ndarray (N, K, Ho, Wo), Ho = floor((H + 2 ph - dh (kh - 1) - 1) / sh) + 1
    cache : ConvCache

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.conv import conv2d_forward
    >>> y, _ = conv2d_forward(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)))
    >>> y[0, 0]
    array([[4., 4.],
           [4., 4.]])
    """
    x, weight, bias, groups = _check_conv_inputs(x, weight, bias, groups, 2)
    kernel = weight.shape[2:]
    stride = check_int_tuple(stride, 2, name="stride", low=1)
    dilation = check_int_tuple(dilation, 2, name="dilation", low=1)
    pads = _padding(padding, kernel, dilation, stride, 2)
    return _forward(x, weight, bias, stride, pads, dilation, groups)


def _forward(x, weight, bias, stride, pads, dilation, groups, squeeze=False):
    """conv2d on validated arrays with explicit ((top, bottom), (left, right)) padding."""
    kernel = weight.shape[2:]
    _check_window_fits(x.shape, kernel, pads, dilation)
    out_hw = tuple(conv_output_size(s, k, st, p0, p1, d) for s, k, st, (p0, p1), d
                   in zip(x.shape[2:], kernel, stride, pads, dilation, strict=True))
    cache = ConvCache(x, weight, bias is not None, stride, pads, dilation, groups, out_hw,
                      squeeze=squeeze)
    return _kernels(x).conv2d_forward(x, weight, bias, cache), cache


def conv2d_backward(dy: Array, cache: ConvCache, needs: Needs = None) -> tuple[Array | None, ...]:
    """Gradients of ``conv2d_forward``: (dx, dweight, dbias).

    ``dx = col2im(W^T dY)``, ``dweight = dY cols^T`` (per group),
    ``dbias[k] = sum_{n, a, b} dy[n, k, a, b]``.

    Parameters
    ----------
    dy : ndarray (N, K, Ho, Wo), the forward's dtype and device
    cache : ConvCache from ``conv2d_forward`` (or ``conv1d_forward``)
    needs : (bool, bool, bool) or None
        Whether x, weight and bias want a gradient (None: all): skip dx for a first layer,
        dweight for frozen weights; the skipped ones are None and are not computed.

    Returns
    -------
    dx : ndarray, shape of x, or None
    dweight : ndarray, shape of weight, or None
    dbias : ndarray (K,) or None (None also when the forward had no bias)
    """
    check_cache(cache, ConvCache, forward="conv2d_forward")
    x, weight = cache.x, cache.weight
    N, K = x.shape[0], weight.shape[0]
    if cache.squeeze:
        dy = dy[:, :, None, :] if getattr(dy, "ndim", 0) == 3 else dy
    dy = check_grad(dy, shape=(N, K, *cache.out_hw), dtype=x.dtype, device=backend(x))
    need_x, need_w, need_b = _needs(needs)
    need_b = need_b and cache.has_bias
    if not (need_x or need_w or need_b):
        return None, None, None
    dx, dw, db = _kernels(x).conv2d_backward(dy, cache, (need_x, need_w, need_b))
    if cache.squeeze:
        dx = None if dx is None else dx[:, :, 0, :]
        dw = None if dw is None else dw[:, :, 0, :]
    return dx, dw, db


def release(cache) -> None:
    """Return the forward's workspace (the cols; Winograd: V of each run of images) to the
    pool when no backward will run (``apply_op``'s ``release``)."""
    if isinstance(cache, ConvCache) and cache.cols is not None:
        _kernels(cache.x).release(cache)


def conv1d_forward(x: Array, weight: Array, bias: Array | None = None,
                   stride: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] | str = 0,
                   dilation: int | tuple[int, ...] = 1, groups: int = 1) -> tuple[Array, ConvCache]:
    """1-D cross-correlation (torch's conv1d): ``conv2d_forward`` on a height-1 image.

    Parameters
    ----------
    x : ndarray (N, C, L); weight : ndarray (K, C / groups, k); bias : (K,) or None
    stride, dilation : int >= 1; padding : int, 'valid' or 'same'; groups : int

    Returns
    -------
    y : ndarray (N, K, Lo), Lo = floor((L + 2 p - d (k - 1) - 1) / s) + 1
    cache : ConvCache (for ``conv1d_backward``)
    """
    x, weight, bias, groups = _check_conv_inputs(x, weight, bias, groups, 1)
    stride = check_int_tuple(stride, 1, name="stride", low=1)[0]
    dilation = check_int_tuple(dilation, 1, name="dilation", low=1)[0]
    pads = _padding(padding, weight.shape[2:], (dilation,), (stride,), 1)
    if x.shape[2] + sum(pads[0]) < dilation * (weight.shape[2] - 1) + 1:
        _check_window_fits(x.shape, weight.shape[2:], pads, (dilation,))
    y, cache = _forward(x[:, :, None, :], weight[:, :, None, :], bias, (1, stride),
                        ((0, 0), pads[0]), (1, dilation), groups, squeeze=True)
    return y[:, :, 0, :], cache


def conv1d_backward(dy: Array, cache: ConvCache, needs: Needs = None) -> tuple[Array | None, ...]:
    """Gradients of ``conv1d_forward``: (dx (N, C, L), dweight (K, C/groups, k), dbias);
    ``needs`` as in ``conv2d_backward``."""
    return conv2d_backward(dy, cache, needs)
