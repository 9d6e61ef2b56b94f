"""Differentiable convolution and pooling (``F.conv1d``, ``F.conv2d``, ``F.max_pool2d``,
``F.avg_pool2d``), torch's names, argument order and semantics.

Each is one autograd op (``nnkit.autograd.apply_op``) on a forward/backward pair of
``nnkit.kernels.conv``, passed as it is; inputs are ``nk.Tensor``s or arrays (wrapped as
constants). The backward computes only the gradients wanted: none for x when it does not
require grad (a network's first layer), as torch does. As in torch, an unbatched
input ((C, L) for conv1d, (C, H, W) for the others) is a batch of one, and so is its result.
"""

from __future__ import annotations

from .._types import Array
from .._validation import check_bool
from ..autograd import Tensor, apply_op, as_tensor
from ..kernels import conv as K

__all__ = ["conv1d", "conv2d", "max_pool2d", "avg_pool2d"]


def _float_tensor(x, name: str) -> Tensor:
    t = as_tensor(x, name=name)
    if t.dtype.kind != "f":
        raise TypeError(f"{name} must be a float32 or float64 array or Tensor, got dtype "
                        f"{t.dtype}")
    return t


_LAYOUTS = {1: ("(C, L)", "(N, C, L)"), 2: ("(C, H, W)", "(N, C, H, W)")}


def _batched(x, nd: int, name: str):
    """``x`` as a float Tensor with a batch axis, and whether it came without one (torch
    reads a (C, *spatial) input as a batch of one and drops the axis from the result)."""
    x = _float_tensor(x, "x")
    if x.ndim == nd + 1:
        return x.unsqueeze(0), True  # (1, C, *spatial)
    if x.ndim != nd + 2:
        one, many = _LAYOUTS[nd]
        raise ValueError(f"x must be {nd + 1}-D {one} unbatched or {nd + 2}-D {many} for "
                         f"{name}, got shape {x.shape}")
    return x, False


def _conv(forward, backward, x, weight, bias, stride, padding, dilation, groups, name, nd):
    """The pair as one op; the backward computes only the gradients ``needs`` asks for (no
    dx for a first layer), and ``release`` frees the cols when no backward will run."""
    (x, unbatched), weight = _batched(x, nd, name), _float_tensor(weight, "weight")
    b = _float_tensor(bias, "bias") if bias is not None else None
    out = apply_op(name, forward, backward, (x, weight, b), stride, padding, dilation, groups,
                   release=K.release)
    return out.squeeze(0) if unbatched else out  # (K, Ho, Wo) for a (C, H, W) x


def conv2d(x: Tensor | Array, weight: Tensor | Array, bias: Tensor | Array | None = None,
           stride: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] | str = 0,
           dilation: int | tuple[int, ...] = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation over (N, C, H, W) images, as ``torch.nn.functional.conv2d``.

    ``y[n, k, a, b] = bias[k] + sum_{c, i, j} w[k, c, i, j] xpad[n, g0 + c, a s + i d, b s + j d]``

    Parameters
    ----------
    x : Tensor (N, C, H, W), or unbatched (C, H, W)
    weight : Tensor (K, C / groups, kh, kw); bias : (K,) or None
    stride, dilation : int or (int, int); padding : int, pair, 'valid' or 'same'
    groups : int dividing C and K

    Returns
    -------
    Tensor (N, K, Ho, Wo), or (K, Ho, Wo) for an unbatched x

    Examples
    --------
    >>> import numpy as np
    >>> import nnkit as nk
    >>> from nnkit.functional.conv import conv2d
    >>> conv2d(np.ones((1, 1, 4, 4), np.float32), np.ones((2, 1, 3, 3), np.float32),
    ...        padding=1).shape
    (1, 2, 4, 4)
    """
    return _conv(K.conv2d_forward, K.conv2d_backward, x, weight, bias, stride, padding,
                 dilation, groups, "conv2d", 2)


def conv1d(x: Tensor | Array, weight: Tensor | Array, bias: Tensor | Array | None = None,
           stride: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] | str = 0,
           dilation: int | tuple[int, ...] = 1, groups: int = 1) -> Tensor:
    """1-D cross-correlation over (N, C, L) sequences, as ``torch.nn.functional.conv1d``.

    Parameters
    ----------
    x : Tensor (N, C, L), or unbatched (C, L)
    weight : Tensor (K, C / groups, k); bias : (K,) or None
    stride, dilation : int; padding : int, 'valid' or 'same'; groups : int

    Returns
    -------
    Tensor (N, K, Lo) ((K, Lo) for an unbatched x), Lo = floor((L + 2 p - d (k - 1) - 1) / s) + 1
    """
    return _conv(K.conv1d_forward, K.conv1d_backward, x, weight, bias, stride, padding,
                 dilation, groups, "conv1d", 1)


def max_pool2d(x: Tensor | Array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
               dilation: int | tuple[int, int] = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows of (N, C, H, W), as ``torch.nn.functional.max_pool2d``.

    ``y[n, c, a, b] = max{xpad[n, c, a s + i d, b s + j d] | i, j in [0, r)}`` (-inf padding);
    the gradient goes to the first maximum of each window in row-major order, as torch.

    Parameters
    ----------
    x : Tensor (N, C, H, W) or unbatched (C, H, W); kernel_size : int or pair;
    stride : default kernel_size;
    padding : at most half the kernel; dilation : int or pair
    ceil_mode : bool, round the output size up (the last window starts inside the input or
        its left padding); return_indices : bool

    Returns
    -------
    Tensor (N, C, Ho, Wo) ((C, Ho, Wo) for an unbatched x); with ``return_indices`` also an
    int64 Tensor of that shape of h W + w, each maximum's position in its (H, W) plane (no
    gradient)
    """
    x, unbatched = _batched(x, 2, "max_pool2d")
    return_indices = check_bool(return_indices, name="return_indices")
    out, cache = apply_op("max_pool2d", K.max_pool2d_forward, K.max_pool2d_backward,
                          (x,), kernel_size, stride, padding, dilation, ceil_mode,
                          with_cache=True)
    if unbatched:
        out = out.squeeze(0)  # (C, Ho, Wo)
    if not return_indices:
        return out
    # the indices are the user's: a copy, so that editing them cannot change the backward
    return out, Tensor((cache.idx[0] if unbatched else cache.idx).copy())


def avg_pool2d(x: Tensor | Array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """Mean over windows of (N, C, H, W), as ``torch.nn.functional.avg_pool2d``.

    The divisor is ``divisor_override`` if given, else (``count_include_pad``, torch's
    default) the window's size clipped to the padded input (kh kw but for ceil_mode's last
    windows), else the number of in-bounds entries.

    Parameters
    ----------
    x : Tensor (N, C, H, W) or unbatched (C, H, W); kernel_size, stride, padding : as
    ``max_pool2d``; ceil_mode, count_include_pad : bool; divisor_override : nonzero int or
    None

    Returns
    -------
    Tensor (N, C, Ho, Wo), or (C, Ho, Wo) for an unbatched x
    """
    x, unbatched = _batched(x, 2, "avg_pool2d")
    out = apply_op("avg_pool2d", K.avg_pool2d_forward, K.avg_pool2d_backward, (x,),
                   kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return out.squeeze(0) if unbatched else out  # (C, Ho, Wo) for a (C, H, W) x
